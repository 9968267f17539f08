import Dispatch
import MicroHTTP
import QueueEngine
import Locking

/// The change feed: the last `capacity` events, already encoded, in `seq` order, with the
/// long polls and SSE streams waiting for newer ones. Fed by one global engine observer.
final class EventLog: Sendable {
    struct Entry: Sendable {
        let seq: UInt64
        let operation: UInt64
        let json: [UInt8]
    }
    struct Waiter: Sendable {
        let id: UInt64
        let after: UInt64
        let fire: @Sendable () -> Void
    }
    struct State: Sendable {
        var ring: [Entry] = []
        var head = 0          // index of the oldest entry when the ring is full
        var firstSeq: UInt64 = 0  // seq of the oldest kept entry (0 = nothing yet)
        var lastSeq: UInt64 = 0
        /// Seqs per operation, for `/v1/operations/{id}/events`.
        var byOperation: [UInt64: [UInt64]] = [:]
        var waiters: [Waiter] = []
        var streams: [UInt64: HTTPStream] = [:]
        var nextID: UInt64 = 1
    }
    let capacity: Int
    private let state = Lock(State())

    init(capacity: Int, startingAfter seq: UInt64 = 0) {
        self.capacity = max(16, capacity)
        state.withLock { $0.lastSeq = seq; $0.firstSeq = seq + 1 }
    }

    var lastSeq: UInt64 { state.withLock { $0.lastSeq } }

    /// The seq of the oldest event still kept.
    var oldestKept: UInt64 { state.withLock { $0.firstSeq } }

    /// Appends a batch from the engine (in seq order) and wakes whoever waits.
    func append(_ events: [ChangeEvent]) {
        let encoded = events.map { Entry(seq: $0.seq, operation: $0.operation.raw, json: $0.json) }
        let fire: [@Sendable () -> Void] = state.withLock { s in
            for e in encoded {
                if s.ring.count < capacity {
                    s.ring.append(e)
                } else {
                    let old = s.ring[s.head]
                    s.ring[s.head] = e
                    s.head = (s.head + 1) % capacity
                    s.firstSeq = old.seq + 1
                    if var list = s.byOperation[old.operation] {
                        if list.first == old.seq { list.removeFirst() }
                        s.byOperation[old.operation] = list.isEmpty ? nil : list
                    }
                }
                s.byOperation[e.operation, default: []].append(e.seq)
                s.lastSeq = e.seq
            }
            if s.ring.count < capacity, let first = s.ring.first { s.firstSeq = first.seq }
            if !s.streams.isEmpty {
                // Streams get batches in seq order: sent under the lock (send only buffers).
                var chunk: [UInt8] = []
                for e in encoded { Self.sse(e, to: &chunk) }
                for st in s.streams.values { st.send(chunk) }
            }
            if s.waiters.isEmpty { return [] }
            let ready = s.waiters.filter { $0.after < s.lastSeq }
            s.waiters.removeAll { $0.after < s.lastSeq }
            return ready.map(\.fire)
        }
        for f in fire { f() }
    }

    static func sse(_ e: Entry, to out: inout [UInt8]) {
        out.append(contentsOf: "id: ".utf8)
        JSONWriter.integer(e.seq, to: &out)
        out.append(contentsOf: "\nevent: change\ndata: ".utf8)
        out.append(contentsOf: e.json)
        out.append(contentsOf: "\n\n".utf8)
    }

    private func entry(_ s: State, seq: UInt64) -> Entry? {
        guard seq >= s.firstSeq, seq <= s.lastSeq, !s.ring.isEmpty else { return nil }
        let offset = Int(seq - s.firstSeq)
        guard offset < s.ring.count else { return nil }
        return s.ring[(s.head + offset) % s.ring.count]
    }

    enum Page { case events([[UInt8]], last: UInt64), gone(oldest: UInt64) }

    /// Events with seq > `after`, at most `limit`.
    func page(after: UInt64, limit: Int) -> Page {
        state.withLock { s in
            if after + 1 < s.firstSeq { return .gone(oldest: s.firstSeq) }
            var out: [[UInt8]] = []
            var seq = after + 1
            while seq <= s.lastSeq && out.count < limit, let e = entry(s, seq: seq) {
                out.append(e.json)
                seq += 1
            }
            return .events(out, last: seq - 1 < after ? after : seq - 1)
        }
    }

    /// The kept events of one operation, oldest first.
    func events(of op: OperationID) -> [(seq: UInt64, json: [UInt8])] {
        state.withLock { s in
            (s.byOperation[op.raw] ?? []).compactMap { seq in entry(s, seq: seq).map { (seq, $0.json) } }
        }
    }

    /// Calls `fire` once something newer than `after` exists (at once if it does now).
    /// Returns a token for `cancelWait`, or nil when it fired at once.
    func wait(after: UInt64, _ fire: @escaping @Sendable () -> Void) -> UInt64? {
        let token: UInt64? = state.withLock { s in
            if s.lastSeq > after { return nil }
            let id = s.nextID
            s.nextID += 1
            s.waiters.append(Waiter(id: id, after: after, fire: fire))
            return id
        }
        if token == nil { fire() }
        return token
    }

    func cancelWait(_ token: UInt64) {
        state.withLock { s in s.waiters.removeAll { $0.id == token } }
    }

    /// Subscribes an SSE stream: sends the backlog after `after`, then every new event.
    func subscribe(_ stream: HTTPStream, after: UInt64) -> Bool {
        let result: (UInt64, [UInt8])? = state.withLock { s in
            if after + 1 < s.firstSeq && s.lastSeq > 0 { return nil }
            var chunk: [UInt8] = Array("retry: 2000\n\n".utf8)
            var seq = after + 1
            while seq <= s.lastSeq, let e = entry(s, seq: seq) { Self.sse(e, to: &chunk); seq += 1 }
            let id = s.nextID
            s.nextID += 1
            // Registered under the same lock as the backlog read, so nothing falls between.
            s.streams[id] = stream
            // Sent under the lock too: a batch appended meanwhile must come after the backlog.
            stream.send(chunk)
            return (id, chunk)
        }
        guard let (id, _) = result else { return false }
        stream.onClose { [weak self] in self?.state.withLock { _ = $0.streams.removeValue(forKey: id) } }
        return true
    }

    /// Closes every stream (server stop).
    func closeStreams() {
        let streams = state.withLock { s in let v = Array(s.streams.values); s.streams = [:]; return v }
        for s in streams { s.close() }
    }

    /// Sends an SSE comment to every stream so dead clients are noticed.
    func heartbeat() {
        let streams = state.withLock { Array($0.streams.values) }
        for s in streams { s.send(Array(": keep-alive\n\n".utf8)) }
    }
}
