import CCurl
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

/// One task's exchange across its redirect hops. Used only on the loop thread; libcurl's
/// callbacks reach it through an unretained pointer that is valid while its easy handle is
/// in ``CurlLoop``'s table.
final class Transfer {
    let task: OutboundTask
    let request: OutboundRequest
    /// Monotonic nanoseconds by which the whole exchange must be done.
    let deadline: UInt64
    private(set) var url: String
    private(set) var method: String
    private(set) var headers: [(String, String)]
    private(set) var body: [UInt8]?
    private(set) var redirects = 0

    // The current hop's response.
    private(set) var header: HeaderBlock
    private(set) var headerOverflow = false
    private var received: [UInt8] = []
    private var size = 0
    private var truncated = false

    private var slist: UnsafeMutablePointer<curl_slist>?
    private let errorBuffer: UnsafeMutablePointer<CChar>

    init(_ task: OutboundTask) {
        self.task = task
        request = task.request
        url = request.url
        method = request.method
        headers = request.headers
        body = request.body
        header = HeaderBlock(limit: request.maxHeaderBytes)
        let seconds = request.timeout.isFinite ? min(max(request.timeout, 0), 86_400 * 365) : 0
        deadline = DispatchTime.now().uptimeNanoseconds &+ UInt64(seconds * 1e9)
        errorBuffer = .allocate(capacity: Int(CCurl_ERROR_SIZE))
        errorBuffer.initialize(repeating: 0, count: Int(CCurl_ERROR_SIZE))
    }

    deinit {
        if let slist { curl_slist_free_all(slist) }
        errorBuffer.deallocate()
    }

    /// Milliseconds left before the deadline (0 when past).
    private var remainingMilliseconds: Int {
        let now = DispatchTime.now().uptimeNanoseconds
        return deadline > now ? Int((deadline - now) / 1_000_000) : 0
    }

    private func invalid(_ why: String) -> Result<UnsafeMutableRawPointer, OutboundError> {
        .failure(OutboundError(type: "invalid-url", detail: why))
    }

    /// An easy handle from `pool`, configured for the current hop.
    ///
    /// Every option the hop needs is set here, on a handle with libcurl's defaults (new, or reset
    /// by the pool), so whatever an earlier request set cannot carry over: an option that is not
    /// set here is libcurl's default.
    func makeHandle(from pool: inout EasyHandlePool) -> Result<UnsafeMutableRawPointer, OutboundError> {
        let remaining = remainingMilliseconds
        guard remaining > 0 else { return .failure(timeoutError()) }
        if case let .failure(e) = OutboundURL.check(url) { return .failure(e) }
        guard !method.isEmpty, method.utf8.allSatisfy(Self.isTokenByte) else { return invalid("method \(OutboundURL.quoted(method)) is not an HTTP token") }
        var list: UnsafeMutablePointer<curl_slist>?
        var hasExpect = false
        var complete = true
        for (name, value) in headers {
            guard !name.isEmpty, name.utf8.allSatisfy(Self.isTokenByte) else {
                if let list { curl_slist_free_all(list) }
                return invalid("header name \(OutboundURL.quoted(name)) is not an HTTP token")
            }
            guard !value.utf8.contains(where: { $0 == 0 || $0 == 0x0A || $0 == 0x0D }) else {
                if let list { curl_slist_free_all(list) }
                return invalid("header \(name) contains CR, LF or NUL")
            }
            if Self.isExpect(name) { hasExpect = true }
            complete = Self.append(name, value, to: &list)
            if !complete { break }
        }
        // No `Expect: 100-continue` round trip for large bodies.
        if complete && !hasExpect { complete = Self.append("Expect", nil, to: &list) }
        guard complete, let easy = pool.take() else {
            if let list { curl_slist_free_all(list) }
            return .failure(OutboundError(type: "network", detail: complete ? "libcurl could not create a handle" : "libcurl could not build the header list"))
        }
        if let slist { curl_slist_free_all(slist) }
        slist = list

        let me = Unmanaged.passUnretained(self).toOpaque()
        _ = CCurl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = CCurl_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0)
        _ = CCurl_easy_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "http,https")
        _ = CCurl_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, remaining)
        let connect = request.connectTimeout.isFinite && request.connectTimeout > 0 ? min(request.connectTimeout * 1000, 3_600_000) : 10_000
        _ = CCurl_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, min(Int(connect), remaining)))
        // Do not wait for a resolver thread when a transfer is dropped (cancel latency).
        _ = CCurl_easy_setopt_long(easy, CURLOPT_QUICK_EXIT, 1)
        _ = CCurl_easy_setopt_pointer(easy, CURLOPT_ERRORBUFFER, errorBuffer)
        _ = CCurl_easy_setopt_write_callback(easy, CURLOPT_WRITEFUNCTION, Transfer.onBody)
        _ = CCurl_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, me)
        _ = CCurl_easy_setopt_write_callback(easy, CURLOPT_HEADERFUNCTION, Transfer.onHeader)
        _ = CCurl_easy_setopt_pointer(easy, CURLOPT_HEADERDATA, me)
        _ = CCurl_easy_setopt_string(easy, CURLOPT_USERAGENT, "opqd")
        // An empty proxy string is libcurl's documented way to ignore the proxy variables.
        if !request.useProxy { _ = CCurl_easy_setopt_string(easy, CURLOPT_PROXY, "") }
        if request.pathAsIs { _ = CCurl_easy_setopt_long(easy, CURLOPT_PATH_AS_IS, 1) }
        _ = CCurl_easy_setopt_pointer(easy, CURLOPT_HTTPHEADER, list)
        if CCurl_easy_setopt_string(easy, CURLOPT_URL, url) != CURLE_OK {
            pool.discard(easy)
            return invalid("libcurl refused URL \(OutboundURL.quoted(url))")
        }
        if let body {
            _ = CCurl_easy_setopt_long(easy, CURLOPT_POST, 1)
            _ = CCurl_easy_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count))
            // COPYPOSTFIELDS: libcurl keeps its own copy, so the array may go away.
            body.withUnsafeBytes { _ = CCurl_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, $0.baseAddress ?? UnsafeRawPointer(errorBuffer)) }
            if method != "POST" { _ = CCurl_easy_setopt_string(easy, CURLOPT_CUSTOMREQUEST, method) }
        } else if method == "HEAD" {
            _ = CCurl_easy_setopt_long(easy, CURLOPT_NOBODY, 1)
        } else if method == "GET" {
            _ = CCurl_easy_setopt_long(easy, CURLOPT_HTTPGET, 1)
        } else {
            _ = CCurl_easy_setopt_string(easy, CURLOPT_CUSTOMREQUEST, method)
        }
        errorBuffer[0] = 0
        header = HeaderBlock(limit: request.maxHeaderBytes)
        headerOverflow = false
        received = []
        size = 0
        truncated = false
        return .success(easy)
    }

    /// Hands the hop's easy handle back to `pool` (it must be out of the multi handle; kept for
    /// another transfer when `reusable`) and frees the hop's header list, which libcurl no
    /// longer points at once the handle is reset or cleaned up.
    func release(_ easy: UnsafeMutableRawPointer, to pool: inout EasyHandlePool, reusable: Bool) {
        pool.giveBack(easy, reusable: reusable)
        if let slist { curl_slist_free_all(slist) }
        slist = nil
    }

    /// True when `name` is `Expect` in any case (no lowercased copy: this runs for every field).
    static func isExpect(_ name: String) -> Bool {
        name.utf8.count == 6 && zip(name.utf8, "expect".utf8).allSatisfy { $0 | 0x20 == $1 }
    }

    /// Appends `name: value` to `list` as libcurl's C string, or `name;` for an empty value
    /// (libcurl's way to send a field with an empty value), or `name:` for nil (libcurl's way to
    /// send no such field). Written straight into one buffer: no Swift string is built per field.
    /// False when libcurl could not allocate (the list is then unchanged).
    static func append(_ name: String, _ value: String?, to list: inout UnsafeMutablePointer<curl_slist>?) -> Bool {
        let count = name.utf8.count + (value.map { $0.isEmpty ? 1 : 2 + $0.utf8.count } ?? 1) + 1
        let appended = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count) { buffer -> UnsafeMutablePointer<curl_slist>? in
            var i = buffer.initialize(fromContentsOf: name.utf8)
            if let value, !value.isEmpty {
                i = buffer[i...].initialize(fromContentsOf: ": ".utf8)
                i = buffer[i...].initialize(fromContentsOf: value.utf8)
            } else {
                buffer[i] = value == nil ? UInt8(ascii: ":") : UInt8(ascii: ";")
                i += 1
            }
            buffer[i] = 0
            return buffer.withMemoryRebound(to: CChar.self) { curl_slist_append(list, $0.baseAddress) }
        }
        guard let appended else { return false }
        list = appended
        return true
    }

    /// Moves to the next hop of a redirect.
    func follow(_ hop: RedirectHop) {
        redirects += 1
        headers = RedirectPolicy.headers(headers, for: hop)
        if !hop.keepsBody { body = nil }
        url = hop.url
        method = hop.method
    }

    // MARK: - callbacks (loop thread, inside curl_multi_perform)

    static let onBody: curl_write_callback = { data, size, count, user in
        guard let user else { return 0 }
        let me = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
        let (n, overflow) = size.multipliedReportingOverflow(by: count)
        guard !overflow else { return 0 }
        return me.receive(UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : n))
    }

    static let onHeader: curl_write_callback = { data, size, count, user in
        guard let user else { return 0 }
        let me = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
        let (n, overflow) = size.multipliedReportingOverflow(by: count)
        guard !overflow else { return 0 }
        let line = UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : n)
        guard me.header.add(line) else {
            me.headerOverflow = true
            return 0  // aborts the transfer (CURLE_WRITE_ERROR)
        }
        return n
    }

    /// Keeps body bytes up to the cap; past it, marks the response truncated and stops reading.
    private func receive(_ chunk: UnsafeRawBufferPointer) -> Int {
        let cap = max(0, request.maxResponseBytes)
        let room = cap - received.count
        size = size.addingReportingOverflow(chunk.count).overflow ? Int.max : size + chunk.count
        if chunk.count <= room {
            received.append(contentsOf: chunk)
            return chunk.count
        }
        received.append(contentsOf: chunk.prefix(max(0, room)))
        truncated = true
        return 0  // aborts the transfer (CURLE_WRITE_ERROR); the kept bytes are the answer
    }

    // MARK: - the end of a hop

    func curlMessage(_ code: CURLcode) -> String {
        if errorBuffer[0] != 0 {
            let count = strnlen(errorBuffer, Int(CCurl_ERROR_SIZE))
            return String(decoding: UnsafeRawBufferPointer(start: errorBuffer, count: count), as: UTF8.self)
        }
        return String(cString: curl_easy_strerror(code))
    }

    /// Success when the hop produced a response (a body cut at the cap counts), else the error.
    /// `message`: libcurl's (``curlMessage(_:)``), used only when `code` is not `CURLE_OK`.
    func outcome(_ code: CURLcode, status: Int, message: String) -> Result<Void, OutboundError> {
        // The quoted URL (an Array and a string) is built only for an error, not for every answer.
        if headerOverflow {
            return .failure(
                OutboundError(type: "invalid-response", detail: "\(OutboundURL.quoted(url)): response headers exceed \(request.maxHeaderBytes) bytes"))
        }
        if code == CURLE_OK || (code == CURLE_WRITE_ERROR && truncated) {
            guard (100...999).contains(status) else {
                return .failure(OutboundError(type: "invalid-response", detail: "\(OutboundURL.quoted(url)): no valid HTTP status"))
            }
            return .success(())
        }
        if code == CURLE_OPERATION_TIMEDOUT { return .failure(timeoutError()) }
        return .failure(hopError(OutboundError(type: Self.errorType(code), detail: "\(OutboundURL.quoted(url)): \(message)")))
    }

    /// A URL that fails after a redirect is the target's doing, not the caller's request:
    /// `redirect-refused`, not `invalid-url` (which the http kind reports as a bad spec).
    func hopError(_ e: OutboundError) -> OutboundError {
        redirects > 0 && e.type == "invalid-url" ? OutboundError(type: "redirect-refused", detail: e.detail) : e
    }

    func timeoutError() -> OutboundError {
        OutboundError(
            type: "timeout",
            detail: "no complete answer from \(OutboundURL.quoted(request.url)) within \(request.timeout) s (last URL \(OutboundURL.quoted(url)))")
    }

    func response(status: Int, contentLength: Int?) -> OutboundResponse {
        OutboundResponse(
            status: status, headers: header.fields, body: received, truncated: truncated, size: size,
            contentLength: contentLength, finalURL: url, redirects: redirects)
    }

    /// The error type for a libcurl result code.
    static func errorType(_ code: CURLcode) -> String {
        switch code {
        case CURLE_OPERATION_TIMEDOUT: return "timeout"
        case CURLE_COULDNT_CONNECT: return "connection-refused"
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY: return "dns"
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ENGINE_NOTFOUND,
            CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_ENGINE_INITFAILED,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
            CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT, CURLE_USE_SSL_FAILED:
            return "tls"
        case CURLE_WEIRD_SERVER_REPLY, CURLE_UNSUPPORTED_PROTOCOL, CURLE_HTTP2, CURLE_HTTP2_STREAM,
            CURLE_BAD_CONTENT_ENCODING, CURLE_GOT_NOTHING, CURLE_HTTP3, CURLE_OUT_OF_MEMORY, CURLE_WRITE_ERROR:
            return "invalid-response"
        case CURLE_URL_MALFORMAT: return "invalid-url"
        default: return "network"
        }
    }

    static func isTokenByte(_ b: UInt8) -> Bool { HTTPSyntax.isTokenByte(b) }
}

/// HTTP grammar checks shared by the client and the `http` kind's spec validation.
public enum HTTPSyntax {
    /// RFC 9110 `tchar`: the bytes of a method or a header field name.
    public static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return Array("!#$%&'*+-.^_`|~".utf8).contains(b)
        }
    }
}
