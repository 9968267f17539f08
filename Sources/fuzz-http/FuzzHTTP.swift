import Foundation
import FuzzMain
import OutboundHTTP
import QueueEngine
import QueueKinds

/// `fuzz-http`: arbitrary bytes through what handles an outbound response — the header
/// parser, `RedirectPolicy.next`, URL checks, and the http kind's result building and
/// `expectStatus` evaluation (`HTTPKind.completion(spec:outcome:)`), and what an answer says
/// about its host (`HTTPKind.verdict`, `RetryAfter`). No network.
///
/// Input: fields separated by NUL bytes — status, Location, current URL, method, header block
/// (lines), kind spec (JSON), body; a missing field is empty. Flags come from the first byte.
///
/// Built normally it replays files (`fuzz-http FILE|DIR...`, default `Fuzz/corpus/http`);
/// built with `-sanitize=fuzzer,address` it is a libFuzzer binary (see CFuzzDriver).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    FuzzHTTP.one(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

enum FuzzHTTP {
    static func one(_ input: [UInt8]) {
        let flags = input.first ?? 0
        var fields = input.dropFirst().split(separator: 0, maxSplits: 6, omittingEmptySubsequences: false).map { Array($0) }
        while fields.count < 7 { fields.append([]) }
        let text = fields.map { String(decoding: $0, as: UTF8.self) }

        // Status: digits as text when they parse, else the raw bytes as a (possibly huge) number.
        var status = Int(text[0]) ?? fields[0].prefix(8).reduce(0) { ($0 << 8) | Int($1) }
        if flags & 1 != 0 { status = [301, 302, 303, 307, 308][Int(flags >> 5) % 5] }
        let location: String? = flags & 2 != 0 ? nil : text[1]
        let base = text[2].isEmpty ? "http://a.example/x/y" : text[2]
        let method = text[3].isEmpty ? "POST" : text[3]

        // The redirect policy, and the URL checks it relies on.
        let decision = RedirectPolicy.next(
            status: status, location: location, currentURL: base, method: method,
            redirects: Int(flags >> 2) % 7)
        if case let .follow(hop) = decision {
            // Bytes, not Characters: a combining mark after "http://" makes String.hasPrefix false
            // although the URL is http (found by this fuzzer; Fuzz/regressions/http/).
            precondition(hop.url.utf8.starts(with: "http://".utf8) || hop.url.utf8.starts(with: "https://".utf8), "followed to \(hop.url)")
            precondition(hop.url.utf8.count <= OutboundURL.maxLength)
            _ = RedirectPolicy.headers([("Authorization", "x"), ("Content-Type", "y")], for: hop)
            if case .failure = OutboundURL.check(hop.url) { preconditionFailure("followed to an unchecked URL \(hop.url)") }
        }
        _ = OutboundURL.check(text[1])
        _ = OutboundURL.resolve(text[1], against: base, errorType: "redirect-refused")

        // The header parser, line by line (as libcurl hands lines over), with a byte cap.
        var block = HeaderBlock(limit: Int(flags) * 64)
        for line in fields[4].split(separator: 0x0A, omittingEmptySubsequences: false) {
            if !block.add(Array(line) + [0x0A]) { break }
            precondition(block.bytes <= block.limit)
        }
        _ = block.value("location")

        // The kind: its spec (fuzzed JSON, or a fixed one) against a fuzzed response or error.
        let spec =
            (try? JSONValue.parse(fields[5]))
            ?? .object([
                ("method", .string("GET")), ("url", .string("http://a.example/")),
                ("expectStatus", .array([.string(text[5]), .number(Double(status))])),
            ])
        let body = fields[6]
        let response = OutboundResponse(
            status: status, headers: block.fields, body: body, truncated: flags & 0x10 != 0,
            size: body.count &* Int(flags), contentLength: flags & 0x20 != 0 ? status : nil,
            finalURL: base, redirects: Int(flags % 6))
        _ = HTTPKind.completion(spec: spec, outcome: .success(response))
        _ = HTTPKind.completion(spec: spec, outcome: .failure(OutboundError(type: text[3], detail: text[1])))
        // What the answer says about its host, and its `Retry-After` read (any value, any now).
        let now = Double(status) * 1e7 + Double(flags)
        if case let .throttle(retryAfter)? = HTTPKind.verdict(spec: spec, outcome: .success(response), now: now), let r = retryAfter {
            precondition(r >= 0 && !r.isNaN, "a Retry-After wait is never negative")
        }
        _ = HTTPKind.verdict(spec: spec, outcome: .failure(OutboundError(type: text[3], detail: text[1])), now: now)
        for t in text { _ = RetryAfter.seconds(t, now: now) }
    }
}

@main enum FuzzHTTPMain {
    static func main() {
        FuzzMain.run("fuzz-http", defaultCorpus: "Fuzz/corpus/http", callback: fuzzHTTP, one: FuzzHTTP.one)
    }
}
