# syntax=docker/dockerfile:1
# Build stage: the Swift toolchain and the -dev packages the package links against.
FROM swift:6.3-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmicrohttpd-dev=0.9.75-6 libsqlite3-dev=3.40.1-2+deb12u2 \
      libcurl4-openssl-dev=7.88.1-10+deb12u15 libpq-dev=15.18-0+deb12u1 pkg-config=1.8.1-1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies in a layer of their own: editing a source file does not fetch them again.
COPY Package.swift Package.resolved* ./
RUN swift package resolve
COPY Sources ./Sources
COPY Tests ./Tests
COPY openapi.yaml ./
# scripts/image-check.sh builds with the flags of this line (it parses them).
RUN swift build -c release --product opqd --static-swift-stdlib \
 && install -D .build/release/opqd /out/opqd

# Runtime stage: only the shared libraries opqd needs at run time (ldd on the binary above),
# the CA bundle for https webhooks and http operations, and tzdata.
# scripts/image-check.sh runs this stage's RUN line in a debootstrap root and opqd in it.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libmicrohttpd12=0.9.75-6 libsqlite3-0=3.40.1-2+deb12u2 libcurl4=7.88.1-10+deb12u15 \
      libpq5=15.18-0+deb12u1 ca-certificates=20250419~deb12u2 tzdata=2026f-0+deb12u1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin opqd \
 && mkdir -p /data && chown opqd /data
COPY --from=build /out/opqd /usr/local/bin/opqd
USER 10001
ENV OPQD_HOST=0.0.0.0 OPQD_PORT=8080 OPQD_DATA=/data
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
# `opqd healthcheck` asks http://127.0.0.1:$OPQD_PORT/readyz (no curl in the image).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/opqd", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/opqd"]
