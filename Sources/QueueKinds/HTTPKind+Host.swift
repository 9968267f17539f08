import OutboundHTTP

// MARK: - the host a request sends to

extension HTTPKind {
    /// The breaker's name for the target of a checked URL (API.md "Hosts"): `host:port`,
    /// lowercase, the port always written (80 for http, 443 for https when none is given), an
    /// IPv6 address in brackets (`[::1]:8080`), an internationalised name in punycode as libcurl
    /// resolves it. The parts come from the check the request itself goes through, so the name
    /// cannot disagree with where the request goes.
    ///
    /// Nil (the operation is not held by any breaker, as before breakers existed) for a target
    /// that `GET`/`PATCH /v1/hosts/{host}` could not name, all of them rare: an IPv6 address with
    /// a zone (`[fe80::1%25eth0]`: another zone is another machine, and `%` is no part of a host
    /// name), port 0, a name with bytes other than letters, digits, `.`, `-` and `_` or longer
    /// than 253 bytes (no DNS name is), or an IDN libcurl cannot put in ASCII. libidn2 reads
    /// an IDN in the process's locale: opqd sets a UTF-8 LC_CTYPE at start (main.swift); in the
    /// C locale it cannot, and the request fails before it is sent (`invalid-url`, reported as
    /// `invalid-spec`): no host to hold.
    static func hostKey(_ parts: OutboundURL.Parts) -> String? {
        guard parts.zone == nil, let host = parts.asciiHost, let port = UInt16(parts.port), port != 0 else { return nil }
        var name: [UInt8] = []
        name.reserveCapacity(host.utf8.count + 6)
        for b in host.utf8 { name.append(b >= 0x41 && b <= 0x5A ? b | 0x20 : b) }
        if name.first == UInt8(ascii: "[") {
            guard name.count > 2, name.count <= 64, name.last == UInt8(ascii: "]"),
                name.dropFirst().dropLast().allSatisfy({ isHexDigit($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") })
            else { return nil }
        } else {
            guard !name.isEmpty, name.count <= 253, name.allSatisfy(isNameByte) else { return nil }
        }
        return String(decoding: name, as: UTF8.self) + ":" + String(port)
    }

    private static func isHexDigit(_ b: UInt8) -> Bool {
        (0x30...0x39).contains(b) || (0x61...0x66).contains(b)
    }

    /// A byte of a lowercased host name: letters, digits, `.`, `-`, `_`.
    private static func isNameByte(_ b: UInt8) -> Bool {
        (0x30...0x39).contains(b) || (0x61...0x7A).contains(b) || b == UInt8(ascii: ".") || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
    }
}
