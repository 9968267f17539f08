// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "opqd",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "opqd", targets: ["opqd"]),
        // libFuzzer target over the request path (scripts/fuzz.sh; Fuzz/README.md).
        .executable(name: "fuzz-request", targets: ["fuzz-request"]),
        // Replays Fuzz/corpus/http files; a fuzzer under -sanitize=fuzzer (scripts/fuzz.sh).
        .executable(name: "fuzz-http", targets: ["fuzz-http"]),
        // The number and date grammars against independent oracles (Foundation's Calendar).
        .executable(name: "fuzz-grammar", targets: ["fuzz-grammar"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2")
    ],
    targets: [
        // A pthread-mutex lock that ThreadSanitizer can see (see Lock.swift).
        .target(name: "Locking"),
        // glibc's GNU extensions (posix_spawn chdir/closefrom, pipe2, unshare) as plain C
        // functions, compiled with _GNU_SOURCE as swift-nio's CNIOLinux is.
        .target(name: "CSystem", cSettings: [.define("_GNU_SOURCE")]),
        // The one posix_spawn wrapper: the command kind's, the tests' and the benchmarks'.
        .target(name: "Spawning", dependencies: ["CSystem"]),
        // The one test kit: raw HTTP client, opqd child processes, test servers, eventually/temp dirs.
        .target(name: "TestKit", dependencies: ["MicroHTTP", "Locking", "Spawning", "CSystem"]),
        // libmicrohttpd itself (apt: libmicrohttpd-dev) plus a fixed-arity shim for its variadic calls.
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        // Small HTTP server on libmicrohttpd. Only Bridge/ touches MHD_*.
        .target(name: "MicroHTTP", dependencies: ["CMicroHTTPD", "Locking"]),
        // The one grammar for numbers and times a client writes as text (query numbers, RFC 3339
        // dates): no dependencies, so the engine, the API and the fuzz target share it.
        .target(name: "Grammar"),
        // Schedules' time (API.md "Schedules"): cron expressions, zones read from the system's tz
        // database (TZif and its POSIX footer), and the daylight-saving rule. No dependencies.
        .target(name: "Schedules"),
        // Pure Swift engine: no HTTP, no C.
        // Release builds drop the runtime exclusivity checks here: the engine mutates its
        // records only under its one lock, and the checks cost ~15% of the flat benchmark.
        .target(
            name: "QueueEngine", dependencies: ["Locking", "Grammar", "Schedules"],
            swiftSettings: [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]),
        // The store seam: the contract the service sees (DurableStore), what both stores share
        // (idempotency records, event windows, writer stats, the group-commit queue), and the
        // memory store. Neither store imports the other.
        .target(name: "StoreKit", dependencies: ["QueueEngine", "Locking", "Schedules"]),
        // SQLite itself (apt: libsqlite3-dev); used only by SQLiteStore.
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // The default store: one SQLite file behind StoreKit's contract.
        .target(name: "SQLiteStore", dependencies: ["QueueEngine", "StoreKit", "CSQLite", "Locking"]),
        // libpq, PostgreSQL's own client library (apt: libpq-dev); used only by PostgresStore.
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        // The same store contract on PostgreSQL (`--store postgres://...`), shared by any number of
        // instances, and the cluster's SQL (membership, leases, id blocks).
        .target(name: "PostgresStore", dependencies: ["QueueEngine", "StoreKit", "CLibPQ", "Locking"]),
        // libcurl itself (apt: libcurl4-openssl-dev) plus fixed-arity wrappers of its variadic calls.
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // Outbound HTTP client on libcurl's multi interface: redirects, caps and errors as values.
        .target(name: "OutboundHTTP", dependencies: ["CCurl", "Locking"]),
        // What operations do.
        .target(name: "QueueKinds", dependencies: ["QueueEngine", "Locking", "OutboundHTTP", "Spawning"]),
        // Hands control to libFuzzer's driver when linked with -sanitize=fuzzer (weak symbol).
        .target(name: "CFuzzDriver"),
        // The entry point both of those targets share: libFuzzer's driver, or a replay of files.
        .target(name: "FuzzMain", dependencies: ["CFuzzDriver"]),
        .executableTarget(name: "fuzz-http", dependencies: ["OutboundHTTP", "QueueKinds", "QueueEngine", "FuzzMain"]),
        .executableTarget(name: "fuzz-grammar", dependencies: ["Grammar", "FuzzMain"]),
        // SHA-256 (idempotency body hashes) and HMAC-SHA256 (webhook signatures). Always optimised:
        // unoptimised, hashing a 100 KiB body took ~25 ms in debug builds, which every test runs.
        .target(name: "Digest", swiftSettings: [.unsafeFlags(["-O"])]),
        // The HTTP face (routes with their scopes, wire types, error mapping), observation (feed,
        // SSE, webhooks, metrics), durability, and the placement seam with its single instance.
        // No concrete store, no cluster.
        .target(
            name: "QueueAPI",
            dependencies: [
                "QueueEngine", "QueueKinds", "StoreKit", "MicroHTTP", "Locking", "OutboundHTTP", "Digest", "Grammar",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Every multi-instance rule, behind QueuePlacement: partitions (planner, leases, remote
        // operations, crash counts), the one owner and its followers, the front that relays
        // requests by route scope, the feed of PostgreSQL's commits, reads from PostgreSQL.
        .target(
            name: "QueueCluster",
            dependencies: [
                "QueueAPI", "QueueEngine", "StoreKit", "PostgresStore", "MicroHTTP", "OutboundHTTP", "Locking", "Digest", "Grammar",
                .product(name: "Logging", package: "swift-log"),
            ]),
        // The composition root: the one place that picks the store and the placement (one
        // switch) and builds the service; the only target that knows every concrete type.
        .target(
            name: "OpqdApp",
            dependencies: [
                "QueueAPI", "QueueCluster", "QueueEngine", "QueueKinds", "StoreKit", "SQLiteStore", "PostgresStore", "MicroHTTP", "Locking",
                .product(name: "Logging", package: "swift-log"),
            ]),
        .executableTarget(
            name: "opqd",
            dependencies: [
                "OpqdApp", "QueueAPI", "QueueCluster", "OutboundHTTP", "QueueEngine", "Locking", "Digest", "Grammar",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Plain build: replays files given on the command line. With
        // `-Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING`: a libFuzzer binary.
        .executableTarget(name: "fuzz-request", dependencies: ["OpqdApp", "QueueAPI", "QueueEngine", "MicroHTTP", "CSystem", "Grammar"]),
        .target(name: "QueueTesting", dependencies: ["OpqdApp", "QueueAPI", "MicroHTTP", "Locking", "TestKit"]),
        .testTarget(name: "QueueEngineTests", dependencies: ["QueueEngine", "Locking", "TestKit"]),
        .testTarget(name: "GrammarTests", dependencies: ["Grammar"]),
        .testTarget(name: "SchedulesTests", dependencies: ["Schedules"]),
        .testTarget(name: "OutboundHTTPTests", dependencies: ["OutboundHTTP", "Locking", "TestKit"]),
        .testTarget(name: "QueueKindsTests", dependencies: ["QueueKinds", "QueueEngine", "Locking", "TestKit", "MicroHTTP"]),
        // Both stores; the PostgreSQL suites need a server (scripts/test.sh starts one: OPQD_TEST_POSTGRES_URL).
        .testTarget(name: "StoreTests", dependencies: ["SQLiteStore", "PostgresStore", "StoreKit", "QueueEngine", "Locking", "TestKit"]),
        .testTarget(name: "MicroHTTPTests", dependencies: ["MicroHTTP", "Locking", "TestKit"]),
        // Depends on the `opqd` executable so crash and shutdown tests can run the real binary.
        .testTarget(name: "APITests", dependencies: ["OpqdApp", "QueueAPI", "QueueCluster", "QueueTesting", "QueueEngine", "Locking", "opqd", "Digest"]),
        // Hostile clients and targets against the real `opqd` binary (a child process on a real port).
        .testTarget(name: "HostileTests", dependencies: ["TestKit", "Locking", "opqd"]),
        // Three real `opqd` processes on one PostgreSQL database (OPQD_TEST_POSTGRES_URL): exactly once,
        // kill -9 failover and SIGSTOP fencing of the owner (scripts/test.sh runs it on its own).
        .testTarget(name: "ClusterTests", dependencies: ["TestKit", "Locking", "Spawning", "PostgresStore", "opqd"]),
    ]
)

// The benchmarks are built only when asked (as Hummingbird builds its own only with an
// environment variable), so CI's debug and ThreadSanitizer builds do not compile them:
//     OPQD_BENCH=1 swift run -c release opqd-bench engine
if let bench = Context.environment["OPQD_BENCH"], !bench.isEmpty, bench != "0" {
    package.products.append(.executable(name: "opqd-bench", targets: ["opqd-bench"]))
    package.targets.append(
        .executableTarget(
            name: "opqd-bench", dependencies: ["QueueEngine", "QueueKinds", "OpqdApp", "QueueAPI", "StoreKit", "SQLiteStore", "PostgresStore", "TestKit"])
    )
}
