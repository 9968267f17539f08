import Foundation
import QueueEngine
import StoreKit
import TestKit
import Testing

@testable import QueueAPI

/// QueueAPI's hand-written JSON (`JSONOut` and the resources it writes) read back by Foundation's
/// `JSONSerialization` and `ISO8601DateFormatter`: every document the API builds by hand parses,
/// and says what was written.
@Suite struct EncodingTests {
    static let pool: [Unicode.Scalar] = ["\"", "\\", "/", "\n", "\u{0}", "\u{1F}", "a", " ", "é", "€", "中", "😀", "\u{2028}"]

    static func string(_ random: inout SplitMix64) -> String {
        var s = String.UnicodeScalarView()
        for _ in 0..<Int(random.next() % 8) { s.append(pool[Int(random.next() % UInt64(pool.count))]) }
        return String(s)
    }

    /// Writes a generated document with `JSONOut` and returns what Foundation should read back.
    static func write(_ o: inout JSONOut, _ random: inout SplitMix64, depth: Int = 0) -> Any {
        switch random.next() % (depth > 2 ? 5 : 7) {
        case 0: o.null(); return NSNull()
        case 1: let b = random.next() % 2 == 0; o.bool(b); return b
        case 2:
            let n = Int64(bitPattern: random.next()) >> Int64(random.next() % 64)
            o.int(n)
            return n
        case 3:
            let d = Double(Int64(bitPattern: random.next()) >> 20) / 1024
            o.number(d)
            return d
        case 4: let s = string(&random); o.string(s); return s
        case 5:
            o.openArray()
            let items = (0..<Int(random.next() % 4)).map { _ in write(&o, &random, depth: depth + 1) }
            o.closeArray()
            return items
        default:
            o.open()
            var members: [String: Any] = [:]
            // `key` takes static strings (the API's member names): a fixed set, each used once.
            let keys: [StaticString] = ["a", "id", "state", "new"]
            for (i, key) in keys.enumerated() where random.next() % 2 == 0 {
                o.key(key)
                members[["a", "id", "state", "new"][i]] = write(&o, &random, depth: depth + 1)
            }
            o.close()
            return members
        }
    }

    static func same(_ a: Any, _ b: Any) -> Bool {
        switch (a, b) {
        case (is NSNull, is NSNull): return true
        case let (x as Bool, y as Bool): return x == y
        case let (x as Int64, y as NSNumber): return y.int64Value == x && y.doubleValue == Double(x)
        case let (x as Double, y as NSNumber): return y.doubleValue == x || abs(y.doubleValue - x) <= 1e-12 * abs(x)
        case let (x as String, y as String): return x == y
        case let (x as [Any], y as [Any]): return x.count == y.count && zip(x, y).allSatisfy { same($0, $1) }
        case let (x as [String: Any], y as [String: Any]):
            return x.count == y.count && x.allSatisfy { key, value in y[key].map { same(value, $0) } ?? false }
        default: return false
        }
    }

    @Test(arguments: 0..<6)
    func generatedDocumentsParseAsWritten(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        for _ in 0..<300 {
            var o = JSONOut()
            o.openArray()  // a container, so every generated value is a complete document
            let expected = [Self.write(&o, &random)]
            o.closeArray()
            let parsed = try JSONSerialization.jsonObject(with: Data(o.bytes))
            #expect(Self.same(expected, parsed), "seed \(seed): \(String(decoding: o.bytes, as: UTF8.self))")
        }
    }

    @Test func integersAtTheEdgesAndTruncation() throws {
        var o = JSONOut()
        o.openArray()
        for n in [Int64.min, Int64.max, -1, 0, 1, 9_007_199_254_740_993] { o.int(n) }
        let kept = o.bytes.count
        o.string("dropped")
        o.truncate(to: kept)
        o.int(UInt64(Int64.max))
        o.closeArray()
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(o.bytes)) as? [NSNumber])
        #expect(parsed.map(\.int64Value) == [.min, .max, -1, 0, 1, 9_007_199_254_740_993, .max])
    }

    @Test func aHostsEventNamesTheHostAndNoOperation() throws {
        let event = ChangeEvent(
            seq: 9, time: Timestamp(nanoseconds: 1_000_000), queue: "[::1]:8080", operation: OperationID(raw: 0), key: .breaker,
            old: .breaker(.halfOpen), new: .breaker(.ramping), state: .ready)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(event.json)) as? [String: Any])
        #expect(Set(object.keys) == ["seq", "time", "host", "key", "old", "new"])
        #expect(object["host"] as? String == "[::1]:8080" && object["key"] as? String == "breaker")
        #expect(object["old"] as? String == "halfOpen" && object["new"] as? String == "ramping")
    }

    @Test func changeEventsParseWithTheirTime() throws {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        var random = SplitMix64(seed: 42)
        let values: [ChangeValue] = [
            .none, .bool(true), .bool(false), .priority(.veryHigh), .int(-3),
            .progress(OperationProgress(completed: 1.5, total: 3)),
        ]
        let keys = ChangeKey.allCases.filter { $0 != .breaker }
        for seq in 1...200 as ClosedRange<UInt64> {
            let ms = Int64(random.next() % 4_000_000_000_000)  // 1970 to 2096
            let event = ChangeEvent(
                seq: seq, time: Timestamp(nanoseconds: ms * 1_000_000), queue: Self.string(&random),
                operation: OperationID(raw: random.next() >> 1),
                key: keys[Int(seq) % keys.count],
                old: values[Int(random.next() % 6)], new: values[Int(random.next() % 6)],
                state: OperationState.allCases[Int(seq) % OperationState.allCases.count])
            let object = try #require(try JSONSerialization.jsonObject(with: Data(event.json)) as? [String: Any])
            #expect((object["seq"] as? NSNumber)?.uint64Value == seq)
            #expect(object["queue"] as? String == event.queue)
            #expect(object["operation"] as? String == event.operation.description)
            #expect(object["key"] as? String == event.key.rawValue)
            #expect(object["state"] as? String == event.state.rawValue)
            let time = try #require(formatter.date(from: object["time"] as? String ?? ""), "\(object)")
            #expect(abs(time.timeIntervalSince1970 * 1000 - Double(ms)) < 0.5, "\(object)")
            if case .progress = event.new {
                #expect((object["new"] as? [String: Any])?["fractionCompleted"] as? NSNumber == 0.5)
            }
        }
    }

    @Test func aQueueSnapshotParsesWithEveryStateCounted() throws {
        let engine = QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore())
        let snapshot = try engine.createQueue(name: "encoded", maxConcurrentOperationCount: 3, isSuspended: true)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(snapshot.json)) as? [String: Any])
        #expect(object["name"] as? String == "encoded")
        #expect((object["maxConcurrentOperationCount"] as? NSNumber)?.intValue == 3)
        #expect(object["isSuspended"] as? Bool == true)
        let counts = try #require(object["counts"] as? [String: Any])
        #expect(Set(counts.keys) == Set(OperationState.allCases.map(\.rawValue)))
        let created = try #require(Timestamp(rfc3339: object["createdAt"] as? String ?? ""))
        #expect(abs(created.seconds - snapshot.createdAt.seconds) < 0.001)
    }
}
