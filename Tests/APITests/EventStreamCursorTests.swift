import Foundation
import QueueEngine
import Testing

@testable import MicroHTTP
@testable import QueueAPI

/// A stream that reconnects (Last-Event-ID) to a cluster instance whose feed is a moment behind
/// the one it read before: what it saw does not come again, and nothing after it is missed.
@Suite("An event stream's cursor")
struct EventStreamCursorTests {
    static func events(_ seqs: ClosedRange<UInt64>) -> [ChangeEvent] {
        seqs.map { seq in
            ChangeEvent(
                seq: seq, time: Timestamp(nanoseconds: Int64(seq) * 1_000_000), queue: "q", operation: OperationID(raw: seq), key: .isReady,
                old: .bool(false), new: .bool(true), state: .ready)
        }
    }

    /// The `id:` lines sent so far, read as a client reads: each time everything buffered has
    /// gone, the stream is asked for more (as the server does when its buffer drains).
    static func ids(_ stream: HTTPStream) -> [UInt64] {
        var bytes: [UInt8] = []
        for _ in 0..<100 {
            let more = stream.takeDetachedBytes()
            bytes += more
            stream.state.withLock { $0.refill }?()
            if more.isEmpty && stream.backlog == 0 { break }
        }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { line in
            line.hasPrefix("id:") ? UInt64(line.dropFirst(3).trimmingCharacters(in: .whitespaces)) : nil
        }
    }

    @Test("in a cluster, a stream resumed (Last-Event-ID) after events this instance has not read yet gets only those past its cursor, live or replayed")
    func aCursorPastTheNewestEventIsKept() {
        let log = EventLog(capacity: 100, sharedSeqs: true)
        log.append(Self.events(1...5))
        // It saw 1...8 elsewhere; this instance has read up to 5.
        let live = HTTPStream.detached()
        #expect(log.subscribe(live, after: 8, resuming: true))
        #expect(Self.ids(live).isEmpty)
        log.append(Self.events(6...7))
        #expect(Self.ids(live).isEmpty, "6 and 7 were seen already")
        log.append(Self.events(8...10))
        #expect(Self.ids(live) == [9, 10])
        log.append(Self.events(11...11))
        #expect(Self.ids(live) == [11])
        // One from before this instance's newest: replayed from its cursor, then live.
        let behind = HTTPStream.detached()
        #expect(log.subscribe(behind, after: 9, resuming: true))
        #expect(Self.ids(behind) == [10, 11])
        log.append(Self.events(12...12))
        #expect(Self.ids(behind) == [12])
        // `?after=` past every event (not a resume): from now, as the dashboard asks.
        let fromNow = HTTPStream.detached()
        #expect(log.subscribe(fromNow, after: UInt64(Int.max)))
        #expect(Self.ids(fromNow).isEmpty)
        log.append(Self.events(13...13))
        #expect(Self.ids(fromNow) == [13])
    }

    @Test("alone, a resumed stream's cursor past every event here is from a history this server does not have: from now")
    func aloneACursorPastTheNewestEventIsFromNow() {
        // A `--store memory` server restarted numbers its events from 1 again.
        let log = EventLog(capacity: 100)
        log.append(Self.events(1...3))
        let stream = HTTPStream.detached()
        #expect(log.subscribe(stream, after: 500, resuming: true))
        #expect(Self.ids(stream).isEmpty)
        log.append(Self.events(4...4))
        #expect(Self.ids(stream) == [4])
    }
}
