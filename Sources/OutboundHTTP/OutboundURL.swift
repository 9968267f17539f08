import CCurl

#if canImport(Glibc)
import Glibc
#endif

/// URL checks and resolution with libcurl's URL API (`curl_url`), never Foundation's `URL`.
public enum OutboundURL {
    /// Longest URL accepted, in bytes (a Location header or a resolved redirect target too).
    public static let maxLength = 8 * 1024

    /// Scheme, host and port of a checked URL; two URLs with equal origins share credentials.
    public struct Parts: Sendable, Equatable {
        /// The whole URL as libcurl normalised it.
        public var url: String
        /// `http` or `https`, lower case.
        public var scheme: String
        /// The host (lower case for names as libcurl returns it; IPv6 in brackets).
        public var host: String
        /// The port, the scheme's default when none is given.
        public var port: String
        /// ``host`` in ASCII, as libcurl resolves it: an internationalised name in punycode
        /// (`bücher.de` is `xn--bcher-kva.de`), any other host as it is; nil when libcurl cannot
        /// convert it (IDNA refuses the name, or libcurl has no IDN support).
        public var asciiHost: String?
        /// The zone of an IPv6 link-local address (`eth0` of `[fe80::1%25eth0]`), which ``host``
        /// leaves out; nil for any other host.
        public var zone: String?
        /// `scheme://host:port` with the host as libcurl connects to it (``asciiHost``), and an
        /// IPv6 address's zone (`%eth0`) after it: the same link-local address on another
        /// interface is another machine, so a redirect there is to another origin (its
        /// credentials are not sent). Not the Unicode host lowercased: `STRAẞE.de` lowercases to
        /// `straße.de`, but libcurl sends it to `strasse.de`, and `straße.de` to
        /// `xn--strae-oqa.de`. Nil when the host has no ASCII form: then it is no origin's.
        public var origin: String? {
            guard let asciiHost else { return nil }
            return "\(scheme)://\(asciiHost.lowercased())\(zone.map { "%" + $0 } ?? ""):\(port)"
        }
    }

    /// Checks an absolute URL: http or https, a host, at most ``maxLength`` bytes, no control
    /// bytes. The error has type `invalid-url`.
    public static func check(_ text: String) -> Result<Parts, OutboundError> {
        resolve(text, against: nil, errorType: "invalid-url")
    }

    /// Resolves `reference` (absolute, scheme-relative `//h/p`, or relative) against `base`
    /// and checks the result as ``check(_:)`` does; errors have type `errorType`.
    public static func resolve(_ reference: String, against base: String?, errorType: String) -> Result<Parts, OutboundError> {
        func fail(_ why: String) -> Result<Parts, OutboundError> {
            .failure(OutboundError(type: errorType, detail: "\(quoted(reference)): \(why)"))
        }
        guard reference.utf8.count <= maxLength else { return fail("longer than \(maxLength) bytes") }
        guard !reference.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) else {
            return fail("contains control characters")
        }
        guard !reference.isEmpty else { return fail("is empty") }
        guard let handle = curl_url() else { return fail("out of memory") }
        defer { curl_url_cleanup(handle) }
        if let base {
            guard curl_url_set(handle, CURLUPART_URL, base, 0) == CURLUE_OK else { return fail("base URL is not valid") }
        }
        let rc = curl_url_set(handle, CURLUPART_URL, reference, CCurl_CURLU_NON_SUPPORT_SCHEME)
        guard rc == CURLUE_OK else { return fail(String(cString: curl_url_strerror(rc))) }
        guard let scheme = part(handle, CURLUPART_SCHEME, 0)?.lowercased() else { return fail("has no scheme") }
        guard scheme == "http" || scheme == "https" else { return fail("scheme \(scheme) is not allowed (http and https only)") }
        guard let host = part(handle, CURLUPART_HOST, 0), !host.isEmpty else { return fail("has no host") }
        guard let port = part(handle, CURLUPART_PORT, CCurl_CURLU_DEFAULT_PORT) else { return fail("has no port") }
        guard let url = part(handle, CURLUPART_URL, 0) else { return fail("cannot be rebuilt") }
        guard url.utf8.count <= maxLength else { return fail("resolves to more than \(maxLength) bytes") }
        guard !url.utf8.contains(where: { $0 < 0x21 || $0 == 0x7F }) else { return fail("resolves to a URL with spaces or control characters") }
        // Only for the rare hosts that need them: a name with non-ASCII bytes, an IPv6 address.
        let asciiHost = host.utf8.allSatisfy { $0 < 0x80 } ? host : part(handle, CURLUPART_HOST, CCurl_CURLU_PUNYCODE)
        let zone = host.utf8.first == UInt8(ascii: "[") ? part(handle, CURLUPART_ZONEID, 0) : nil
        return .success(Parts(url: url, scheme: scheme, host: host, port: port, asciiHost: asciiHost, zone: zone))
    }

    private static func part(_ handle: OpaquePointer, _ which: CURLUPart, _ flags: UInt32) -> String? {
        var out: UnsafeMutablePointer<CChar>?
        guard curl_url_get(handle, which, &out, flags) == CURLUE_OK, let out else { return nil }
        defer { curl_free(out) }
        return String(decoding: UnsafeRawBufferPointer(start: out, count: strlen(out)), as: UTF8.self)
    }

    /// `text` in quotes, cut to 200 bytes, for error details.
    static func quoted(_ text: String) -> String {
        let bytes = Array(text.utf8.prefix(200))
        return "\"" + String(decoding: bytes, as: UTF8.self) + (text.utf8.count > 200 ? "…\"" : "\"")
    }
}
