import TestKit
import Testing

@testable import QueueAPI

/// `Router.segments` splits ASCII paths by bytes for speed: it must give what the Character
/// split it replaced gives, for every path.
@Suite struct RouterSegmentsTests {
    static func characterSplit(_ path: String) -> [Substring] { path.split(separator: "/", omittingEmptySubsequences: false) }

    @Test func segmentsAreTheCharacterSplit() {
        let fixed = [
            "/", "//", "/v1/queues/q/operations", "/v1/queues/q/operations/", "/v1//queues", "/a/b/../c", "/%2F/x",
            "/v1/queues/\r\n/x", "/v1/queues/é/ops", "/v1/queues/e\u{301}/ops", "/v1/queues/\u{301}x", "/a/\u{301}/b", "/\u{1F1E9}\u{1F1EA}/x",
            "/a\u{0}/b", "/\u{7F}/\u{80}", "/ü//", "/Ω/\u{2126}",
        ]
        for path in fixed { #expect(Router.segments(path) == Self.characterSplit(path), "\(path.debugDescription)") }
        let alphabet = Array("/ab%.-_~\r\n\t ?#".unicodeScalars) + ["\u{301}", "é", "\u{1F600}", "\u{0}"]
        var rng = SplitMix64(seed: 0x5E6)
        for _ in 0..<20_000 {
            var path = "/"
            for _ in 0..<Int.random(in: 0...16, using: &rng) { path.unicodeScalars.append(alphabet[Int.random(in: 0..<alphabet.count, using: &rng)]) }
            #expect(Router.segments(path) == Self.characterSplit(path), "\(path.debugDescription)")
        }
    }
}
