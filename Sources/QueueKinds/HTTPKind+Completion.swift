import Foundation
import OutboundHTTP
import QueueEngine

// MARK: - what a response ends as

extension HTTPKind {
    /// What an operation with `spec` reports for `outcome`, the end of its request: the
    /// result, `http-status` outside `expectStatus`, or the transport error. An invalid spec
    /// gives `invalid-spec`. Total on any input (the fuzz target feeds it arbitrary ones).
    public static func completion(spec: JSONValue?, outcome: Result<OutboundResponse, OutboundError>) -> Completion {
        do {
            return completion(try HTTPSpec(spec), outcome)
        } catch {
            return .failed(type: "invalid-spec", detail: describe(error))
        }
    }

    static func completion(_ spec: HTTPSpec, _ outcome: Result<OutboundResponse, OutboundError>) -> Completion {
        switch outcome {
        case let .failure(error):
            // The spec's URL was checked with the same rules, so this is a client-side refusal.
            let type = error.type == "invalid-url" ? "invalid-spec" : error.type
            return .failed(type: type, detail: error.detail)
        case let .success(response):
            let result = HTTPResult.json(response)
            let status = response.status
            if spec.expect.contains(where: { $0.matches(status) }) { return .succeeded(result) }
            let expected = JSONValue.array(spec.expect.map(\.json)).text
            return .failed(type: "http-status", detail: "status \(status) is outside expectStatus \(expected)", data: result)
        }
    }
}

// MARK: - what a response says about its host

extension HTTPKind {
    /// What the end of a request says about its host (API.md "Hosts"), nil when it says nothing
    /// (a refused redirect, an invalid spec). A status the spec expects is healthy, whatever it
    /// is; otherwise 429, or 503 with a `Retry-After`, asks to slow down, another 5xx is a
    /// failure, and anything else (a 4xx too) is healthy. Connection, DNS, TLS, timeout,
    /// network and invalid-response errors are failures. Total on any input.
    public static func verdict(spec: JSONValue?, outcome: Result<OutboundResponse, OutboundError>, now: Double) -> HostVerdict? {
        guard let s = try? HTTPSpec(spec) else { return nil }
        return verdict(s, outcome, now: now)
    }

    static func verdict(_ spec: HTTPSpec, _ outcome: Result<OutboundResponse, OutboundError>, now: Double) -> HostVerdict? {
        switch outcome {
        case let .failure(error):
            switch error.type {
            case "timeout", "connection-refused", "dns", "tls", "network", "invalid-response": return .failure
            default: return nil
            }
        case let .success(response):
            let status = response.status
            if spec.expect.contains(where: { $0.matches(status) }) { return .healthy }
            let retryAfter = RetryAfter.seconds(in: response.headers, now: now)
            if status == 429 { return .throttle(retryAfter: retryAfter) }
            if status == 503, let retryAfter { return .throttle(retryAfter: retryAfter) }
            if (500...599).contains(status) { return .failure }
            return .healthy
        }
    }

    /// Seconds since 1970, as `Retry-After` dates count.
    static func unixNow() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// The result object of a response.
enum HTTPResult {
    /// `{"status", "headers", "body", "bodyEncoding", "size", "truncated"}`. Header fields
    /// are sorted by lower-cased name; repeated fields are joined with ", " under the first
    /// spelling of the name. `size` is the bytes received, or the declared Content-Length
    /// when the body was cut and declared longer.
    static func json(_ response: OutboundResponse) -> JSONValue {
        var merged: [(String, String)] = []
        var index: [String: Int] = [:]
        for (name, value) in response.headers {
            let key = name.lowercased()
            if let i = index[key] {
                merged[i].1 += ", " + value
            } else {
                index[key] = merged.count
                merged.append((name, value))
            }
        }
        merged.sort { $0.0.lowercased() < $1.0.lowercased() }
        let body = response.body
        let truncated = response.truncated
        var size = max(response.size, body.count)
        if truncated, let declared = response.contentLength, declared > size { size = declared }
        var kept = body[...]
        if truncated { kept = kept.dropLast(incompleteUTF8Suffix(body)) }
        let text = String(validating: kept, as: UTF8.self)
        let (bodyValue, encoding): (String, String) = text.map { ($0, "utf8") } ?? (Data(body).base64EncodedString(), "base64")
        return .object([
            ("status", .number(Double(response.status))),
            ("headers", .object(merged.map { ($0.0, JSONValue.string($0.1)) })),
            ("body", .string(bodyValue)),
            ("bodyEncoding", .string(encoding)),
            ("size", .number(Double(size))),
            ("truncated", .bool(truncated)),
        ])
    }

    /// How many bytes at the end of `bytes` are an unfinished UTF-8 sequence (cut by the cap).
    static func incompleteUTF8Suffix(_ bytes: [UInt8]) -> Int {
        var i = bytes.count - 1
        var continuation = 0
        while i >= 0, continuation < 3, bytes[i] & 0xC0 == 0x80 { continuation += 1; i -= 1 }
        guard i >= 0 else { return 0 }
        let lead = bytes[i]
        let need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0
        return need > continuation ? continuation + 1 : 0
    }
}
