import Dispatch
import Locking
import MicroHTTP
import QueueEngine

/// The change feed: the last `capacity` events, already encoded, in `seq` order, with the
/// long polls and SSE streams waiting for newer ones. Fed by one global engine observer on a
/// single instance, and from PostgreSQL's committed events in a cluster (`OwnerFeed`,
/// `FeedTail`).
package final class EventLog: Sendable {
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
    /// An SSE client: `cursor` is the last seq handed to its stream. While `live`, new events are
    /// pushed to it as they come (bounded by `maxBacklog`); otherwise it is still replaying older
    /// events, which its stream pulls from the ring as the client reads (`refill`).
    struct Subscriber: Sendable {
        let stream: HTTPStream
        var cursor: UInt64
        var live: Bool
    }
    struct State: Sendable {
        var ring: [Entry] = []
        var head = 0  // index of the oldest entry when the ring is full
        var firstSeq: UInt64 = 0  // seq of the oldest kept entry (0 = nothing yet)
        var lastSeq: UInt64 = 0
        /// Seqs per operation, for `/v1/operations/{id}/events`.
        var byOperation: [UInt64: [UInt64]] = [:]
        var waiters: [Waiter] = []
        var streams: [UInt64: Subscriber] = [:]
        var nextID: UInt64 = 1
        /// Bytes of JSON in the ring (for a subscriber's lag in bytes).
        var ringBytes = 0
    }
    /// Bytes an SSE client may fall behind before it is cut off.
    let maxBacklog: Int
    /// Bytes of older events handed to a replaying stream at a time.
    static let refillBytes = 64 * 1024
    let capacity: Int
    private let state = Lock(State())

    /// True when the events' seqs are shared with other instances (a cluster): a resuming
    /// stream's cursor past the newest event here is then a moment ahead of this instance's
    /// feed and kept as it is (`subscribe`); alone, it is from a history this server does not
    /// have (a `--store memory` restart numbers from 1 again) and is read as "from now".
    let sharedSeqs: Bool

    package init(capacity: Int, startingAfter seq: UInt64 = 0, maxBacklog: Int = 1 << 20, sharedSeqs: Bool = false) {
        self.capacity = max(16, capacity)
        self.maxBacklog = max(4096, maxBacklog)
        self.sharedSeqs = sharedSeqs
        state.withLock {
            $0.lastSeq = seq; $0.firstSeq = seq + 1
        }
    }

    package var lastSeq: UInt64 { state.withLock { $0.lastSeq } }

    /// Open SSE streams, for `/metrics`.
    package var streamCount: Int { state.withLock { $0.streams.count } }

    /// The seq of the oldest event still kept.
    var oldestKept: UInt64 { state.withLock { $0.firstSeq } }

    /// Appends a batch from the engine (in seq order) and wakes whoever waits.
    package func append(_ events: [ChangeEvent]) {
        let all = events.map { Entry(seq: $0.seq, operation: $0.operation.raw, json: $0.json) }
        // Streams cut off are closed after the lock is released: their close callbacks take it.
        var cutOff: [HTTPStream] = []
        let fire: [@Sendable () -> Void] = state.withLock { s in
            // In seq order only (a follower's reads could overlap): the lookups bisect, and
            // live streams must not get an event twice.
            var encoded: [Entry] = []
            encoded.reserveCapacity(all.count)
            var last = s.lastSeq
            for e in all where e.seq > last {
                encoded.append(e)
                last = e.seq
            }
            for e in encoded {
                s.ringBytes += e.json.count
                if s.ring.count < capacity {
                    s.ring.append(e)
                } else {
                    let old = s.ring[s.head]
                    s.ringBytes -= old.json.count
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
            if !s.streams.isEmpty {
                // Live streams get batches in seq order: sent under the lock (send only buffers).
                // A replaying stream pulls them from the ring when it gets there.
                var chunk: [UInt8] = []
                for e in encoded { Self.sse(e, to: &chunk) }
                for (id, sub) in s.streams where sub.live {
                    // One that came in after events this instance had not read yet gets only
                    // those past its cursor.
                    var part = chunk
                    if let first = encoded.first, sub.cursor >= first.seq {
                        part = []
                        for e in encoded where e.seq > sub.cursor { Self.sse(e, to: &part) }
                        if part.isEmpty { continue }
                    }
                    if sub.stream.send(part, maxBacklog: maxBacklog) {
                        s.streams[id]?.cursor = max(sub.cursor, s.lastSeq)
                    } else {
                        // Behind by more than the bound: it goes back to pulling from the ring as
                        // it reads (its cursor stays at what it was handed); `cutOffStalled` cuts
                        // it off if it does not read at all.
                        s.streams[id]?.live = false
                        // An empty buffer means a suspended connection that no refill would
                        // wake: hand it the first piece now.
                        if sub.stream.backlog == 0, let overtaken = fill(&s, id) { cutOff.append(overtaken) }
                    }
                }
            }
            if s.waiters.isEmpty { return [] }
            let ready = s.waiters.filter { $0.after < s.lastSeq }
            s.waiters.removeAll { $0.after < s.lastSeq }
            return ready.map(\.fire)
        }
        for st in cutOff { st.close() }
        for f in fire { f() }
    }

    static func sse(_ e: Entry, to out: inout [UInt8]) {
        out.append(contentsOf: "id: ".utf8)
        JSONWriter.integer(e.seq, to: &out)
        out.append(contentsOf: "\nevent: change\ndata: ".utf8)
        out.append(contentsOf: e.json)
        out.append(contentsOf: "\n\n".utf8)
    }

    /// The kept entry at logical position `i` (0 = oldest).
    private func at(_ s: State, _ i: Int) -> Entry { s.ring[(s.head + i) % s.ring.count] }

    /// The logical position of the first kept entry with a seq above `after` (`ring.count` when
    /// none). The seqs kept are increasing but need not be consecutive: events of a queue
    /// deleted, or of operations purged, before a follower read them are not in its feed.
    private func position(_ s: State, after: UInt64) -> Int {
        var (lo, hi) = (0, s.ring.count)
        while lo < hi {
            let mid = (lo + hi) / 2
            if at(s, mid).seq <= after { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    private func entry(_ s: State, seq: UInt64) -> Entry? {
        guard seq > 0 else { return nil }
        let i = position(s, after: seq - 1)
        guard i < s.ring.count else { return nil }
        let e = at(s, i)
        return e.seq == seq ? e : nil
    }

    enum Page { case events([[UInt8]], last: UInt64), gone(oldest: UInt64) }

    /// Events with seq > `after`, at most `limit`.
    func page(after: UInt64, limit: Int, maxBytes: Int = .max) -> Page {
        state.withLock { s in
            if after < s.firstSeq - 1 { return .gone(oldest: s.firstSeq) }
            var out: [[UInt8]] = []
            var bytes = 0
            var seq = after
            var i = position(s, after: after)
            while i < s.ring.count && out.count < limit {
                let e = at(s, i)
                if !out.isEmpty && bytes + e.json.count + 1 > maxBytes { break }
                out.append(e.json)
                bytes += e.json.count + 1
                seq = e.seq
                i += 1
            }
            return .events(out, last: seq)
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

    /// Subscribes an SSE stream from `after`: older events are pulled from the ring as the
    /// client reads, new ones pushed once it has caught up. False when `after` is older than what
    /// is kept (the caller answers 410).
    /// An `after` past the newest event starts the stream from now (the dashboard asks so), but
    /// for a stream `resuming` (`after` is the last event the client saw, its `Last-Event-ID`)
    /// in a cluster (`sharedSeqs`): this instance's feed may be a moment behind the one the
    /// client read before, and what it saw must not come again.
    func subscribe(_ stream: HTTPStream, after: UInt64, resuming: Bool = false) -> Bool {
        let id: UInt64? = state.withLock { s in
            if after < s.firstSeq - 1 && s.lastSeq > 0 { return nil }
            let id = s.nextID
            s.nextID += 1
            s.streams[id] = Subscriber(stream: stream, cursor: resuming && sharedSeqs ? after : min(after, s.lastSeq), live: false)
            return id
        }
        guard let id else { return false }
        // Registered before the first bytes: each time the client has read everything, the
        // next piece of older events is handed over, until it has caught up and goes live.
        stream.onDrained { [weak self] in
            guard let self else { return }
            let overtaken = self.state.withLock { s in self.fill(&s, id) }
            overtaken?.close()
        }
        stream.onClose { [weak self] in self?.state.withLock { _ = $0.streams.removeValue(forKey: id) } }
        stream.send(Array("retry: 2000\n\n".utf8))
        return true
    }

    /// Hands a replaying stream its next piece of older events, or marks it live when it has
    /// caught up. Called under the lock, so nothing appended meanwhile falls between. Returns the
    /// stream when the ring has overtaken it: the caller closes it once the lock is released.
    private func fill(_ s: inout State, _ id: UInt64) -> HTTPStream? {
        guard var sub = s.streams[id], !sub.live else { return nil }
        if sub.cursor < s.firstSeq - 1 {
            // What it needs next is gone. Closing ends the stream after the last whole event; the
            // client reconnects with Last-Event-ID and gets a 410.
            s.streams[id] = nil
            return sub.stream
        }
        var chunk: [UInt8] = []
        var seq = sub.cursor
        var i = position(s, after: seq)
        while i < s.ring.count && chunk.count < Self.refillBytes {
            let e = at(s, i)
            Self.sse(e, to: &chunk)
            seq = e.seq
            i += 1
        }
        if i >= s.ring.count { seq = max(seq, s.lastSeq) }
        sub.cursor = seq
        sub.live = seq >= s.lastSeq
        s.streams[id] = sub
        if !chunk.isEmpty { sub.stream.send(chunk) }
        return nil
    }

    /// Cuts off replaying streams whose client has stopped reading (nothing taken for
    /// `stall` seconds) while the events it still has to get pass the backlog bound. A replaying
    /// stream holds at most one refill in memory, but a client that does not read must not hold
    /// a subscription open forever either (API.md "Limits"). Called every second.
    package func cutOffStalled(stall: Double = 2) {
        let limit = UInt64(stall * 1e9)
        let cut: [HTTPStream] = state.withLock { s in
            guard !s.ring.isEmpty else { return [] }
            let average = max(1, s.ringBytes / s.ring.count)
            var out: [HTTPStream] = []
            for (id, sub) in s.streams {
                let behind = s.lastSeq > sub.cursor ? s.lastSeq - sub.cursor : 0
                let lag = behind > UInt64(Int.max / average) ? Int.max : Int(behind) * average
                // A live stream is cut by `send` once its own buffer passes the bound; a live one
                // with nothing waiting is suspended (not asked for bytes) and fine.
                if sub.live {
                    guard sub.stream.backlog >= maxBacklog / 2, sub.stream.idleNanoseconds > limit else { continue }
                } else {
                    // Replaying always has more to send: not asked for bytes means not reading.
                    guard lag > maxBacklog, sub.stream.idleNanoseconds > limit else { continue }
                }
                s.streams[id] = nil
                out.append(sub.stream)
            }
            return out
        }
        for st in cut { st.close() }
    }

    /// Closes every stream (server stop).
    package func closeStreams() {
        let streams = state.withLock { s in
            let v = s.streams.values.map(\.stream); s.streams = [:]; return v
        }
        for s in streams { s.close() }
    }

    /// Sends an SSE comment to every stream so dead clients are noticed.
    package func heartbeat() {
        let streams = state.withLock { $0.streams.values.map(\.stream) }
        for s in streams where !s.send(Array(": keep-alive\n\n".utf8), maxBacklog: maxBacklog) { s.close() }
    }
}
