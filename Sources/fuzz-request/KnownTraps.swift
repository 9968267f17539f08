import Glibc
import MicroHTTP
import QueueEngine

/// Traps found by this target, reported, and not fixed yet in files its author does not own.
/// Requests that would reach one are skipped, so that fuzzing gets past them to new ones; each
/// has its reproducer in `Fuzz/regressions/request/`. Delete an entry once its fix is merged.
/// `FUZZ_REQUEST_KNOWN_TRAPS=crash` runs them anyway (`scripts/fuzz.sh` does, to replay the
/// regressions).
enum KnownTraps {
    static let suppressed: Bool = {
        guard let v = getenv("FUZZ_REQUEST_KNOWN_TRAPS") else { return true }
        return String(cString: v) != "crash"
    }()

    /// The trap this request would reach, if it is a known one.
    static func match(_ r: HTTPRequest) -> String? {
        // Routes.swift eventStream: `after + 1` overflows for Last-Event-ID 18446744073709551615
        // (regressions/request/last-event-id-max).
        if r.path == "/v1/events/stream", r.query["after"] == nil,
           let last = r.header("last-event-id"), UInt64(last) == UInt64.max {
            return "last-event-id-max"
        }
        // HTTPKind.swift HTTPSpec.init: `Int(String(s.prefix(1)))!` on a 3-character "?xx" whose
        // first Character is a digit plus combining marks, e.g. "1\u0301xx"
        // (regressions/request/expect-status-combining).
        if !r.body.isEmpty, r.body.contains(UInt8(ascii: "x")), let json = try? JSONValue.parse(r.body), hasCombiningStatusClass(json) {
            return "expect-status-combining"
        }
        return nil
    }

    static func hasCombiningStatusClass(_ v: JSONValue) -> Bool {
        switch v {
        case let .object(members):
            for (k, value) in members {
                if k == "expectStatus", case let .array(items) = value {
                    for case let .string(s) in items where s.count == 3 && s.hasSuffix("xx") {
                        let first = String(s.prefix(1))
                        if ("1"..."5").contains(first) && Int(first) == nil { return true }
                    }
                }
                if hasCombiningStatusClass(value) { return true }
            }
            return false
        case let .array(items):
            return items.contains(where: hasCombiningStatusClass)
        default:
            return false
        }
    }
}
