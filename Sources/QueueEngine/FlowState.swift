/// The engine's flow-control state, under its lock: token buckets, limiters with their keys,
/// and the fair order of a queue's ready operations.

/// A token bucket, read lazily: its tokens are worked out from the time of the last read.
struct TokenBucket {
    var limit: RateLimit
    var tokens: Double
    var last: Int64

    init(_ limit: RateLimit, now: Int64) {
        self.limit = limit
        tokens = Double(limit.burst)
        last = now
    }

    mutating func refill(_ now: Int64) {
        guard now > last else { return }
        let add = Double(now &- last) / 1e9 * limit.perSecond
        tokens = Swift.min(Double(limit.burst), tokens + add)
        last = now
    }

    /// A token is there (after a refill to `now`).
    mutating func has(_ now: Int64) -> Bool {
        refill(now)
        return tokens >= 1
    }

    mutating func take() { tokens -= 1 }

    var isFull: Bool { tokens >= Double(limit.burst) }

    /// Nanoseconds from the last refill until a whole token is there (0 when one is).
    var untilToken: Int64 {
        if tokens >= 1 { return 0 }
        let s = (1 - tokens) / limit.perSecond
        return Swift.max(1, Int64(saturating: (s * 1e9).rounded(.up)))
    }

    /// A new setting: the bucket starts full (API.md).
    mutating func reset(_ limit: RateLimit, now: Int64) { self = TokenBucket(limit, now: now) }
}

/// A limiter with the keys in use.
final class LimiterRecord: @unchecked Sendable {  // guarded by the engine lock
    let name: String
    let createdAt: Timestamp
    var settings: LimiterSettings
    var revision: UInt64 = 1
    var keys: [String: LimiterKey] = [:]
    var running = 0
    var waiting = 0
    /// Unfinished operations that name it: while any do, it cannot be deleted.
    var refs = 0
    /// When idle keys were last swept (`EngineCore.checkLimits`).
    var lastSweep: Int64 = .min
    /// The keys sorted for the keys listing, and when (rebuilt at most once a second).
    var sortedKeys: [String] = []
    var sortedAt: Int64 = .min

    init(name: String, settings: LimiterSettings, createdAt: Timestamp) {
        self.name = name; self.settings = settings; self.createdAt = createdAt
    }

    func snapshot() -> LimiterSnapshot {
        LimiterSnapshot(
            name: name, settings: settings, createdAt: createdAt, revision: revision, running: running, waiting: waiting,
            keys: keys.count)
    }
}

/// Where ready operations wait that something other than their queue holds back (a limiter
/// key without room, a host that is not closed): taken off their queue's ready order, they
/// cost nothing while they wait, and come back in O(log n) when it has room.
class ParkingLot: @unchecked Sendable {  // guarded by the engine lock
    /// Operations parked here, a min-heap of their keys as in the queue's heap (priority
    /// rank, then id). An entry is live while its operation's `parkedOn` is this lot and its
    /// `parkKey` the entry; stale ones are skipped. Nothing else is kept per parked operation,
    /// so one held costs what one ready costs (an entry in a heap).
    final var parked: [UInt64] = []
    /// Live entries.
    final var parkedCount = 0
    /// Listed in `EngineCore.flowRecheck`.
    final var rechecking = false

    final var hasParked: Bool { parkedCount > 0 }

    final func park(_ op: OpRecord, _ table: OpTable) {
        let k = op.priority.rank << 60 | op.id
        op.parkedOn = self
        op.parkKey = k
        parkedCount += 1
        // Stale entries are dropped once they outnumber the live ones (plus a margin): the
        // heap stays bounded by what is parked.
        if parked.count > 2 * parkedCount + 64 {
            parked = parked.filter { isLive($0, table) }.sorted()
        }
        FairReady.heapPush(&parked, k)
    }

    @inline(__always)
    private final func isLive(_ entry: UInt64, _ table: OpTable) -> Bool {
        guard let op = table[entry & QueueRecord.idMask] else { return false }
        return op.parkedOn === self && op.parkKey == entry
    }

    /// The next live parked operation, taken off.
    final func unpark(_ table: OpTable) -> OpRecord? {
        while let top = parked.first {
            FairReady.heapRemoveTop(&parked)
            if let op = table[top & QueueRecord.idMask], op.parkedOn === self, op.parkKey == top {
                parkedCount -= 1
                op.parkedOn = nil
                op.parkKey = 0
                if op.state == .ready { return op }
            }
        }
        return nil
    }

    /// Forgets `op` (it left the ready state while parked): its heap entry goes stale.
    final func forget(_ op: OpRecord) {
        guard op.parkedOn === self else { return }
        parkedCount -= 1
        op.parkedOn = nil
        op.parkKey = 0
        if parkedCount == 0 { parked.removeAll(keepingCapacity: false) }
    }
}

/// One key of a limiter: its own slots and bucket, and the ready operations it holds back.
final class LimiterKey: ParkingLot, @unchecked Sendable {  // guarded by the engine lock
    unowned let limiter: LimiterRecord
    let key: String
    var running = 0
    var waiting = 0
    /// Unfinished operations that name it; the key is forgotten once none do, nothing runs and
    /// its bucket is full.
    var refs = 0
    var bucket: TokenBucket?
    /// A refill wake-up is armed for this key; `wakeGeneration` names the current one (a new
    /// bucket makes an armed one stale).
    var wakeArmed = false
    var wakeGeneration: UInt64 = 0
    /// Its lease of the shared budget, when the budgets are shared (`EngineCore.sharedLimiters`).
    var lease = KeyLease()
    let shared: Bool

    init(limiter: LimiterRecord, key: String, shared: Bool) {
        self.limiter = limiter; self.key = key; self.shared = shared
        super.init()
    }

    var budget: LimiterBudget { limiter.settings.budget(for: key) }

    /// Makes the bucket match the budget's rate (kept while unchanged). A new bucket makes an
    /// armed wake-up stale: the next park arms one for it.
    func syncBucket(now: Int64) {
        let rate = budget.rate
        if rate != bucket?.limit {
            bucket = rate.map { TokenBucket($0, now: now) }
            wakeArmed = false
            wakeGeneration &+= 1
        }
    }

    /// Why this key cannot start one more operation now; nil when it can.
    func blocked(now: Int64) -> WaitReason.LimiterWaitReason? {
        if shared {
            let (slots, tokens) = leaseDimensions
            if slots && running >= usableSlots(now) { return .concurrency }
            if tokens && currentTokens(now) < 1 { return .rate }
            return nil
        }
        let b = budget
        if let c = b.concurrency, running >= c { return .concurrency }
        if b.rate != nil {
            syncBucket(now: now)
            if bucket?.has(now) == false { return .rate }
        }
        return nil
    }

    /// How many more may start now (concurrency and whole tokens).
    func room(now: Int64) -> Int {
        if shared {
            let (slots, tokens) = leaseDimensions
            var r = Int.max
            if slots { r = Swift.max(0, usableSlots(now) - running) }
            if tokens { r = Swift.min(r, Swift.max(0, currentTokens(now))) }
            return r
        }
        let b = budget
        var r = Int.max
        if let c = b.concurrency { r = Swift.max(0, c - running) }
        if b.rate != nil {
            syncBucket(now: now)
            if var bucket {
                bucket.refill(now)
                self.bucket = bucket
                r = Swift.min(r, Int(Swift.max(0, Swift.min(bucket.tokens, 1e9))))
            }
        }
        return r
    }

    /// Nothing names it, nothing runs, and its bucket is full: it can be forgotten.
    func isIdle(now: Int64) -> Bool {
        guard refs == 0 && running == 0 else { return false }
        // Slots held from a shared budget go back first (`EngineCore.askLease`).
        if shared { return lease.slots == 0 && !lease.asking }
        guard var bucket else { return true }
        bucket.refill(now)
        return bucket.isFull
    }

    /// A start takes a token: from the bucket, or from the lease of a shared budget.
    func takeStart() {
        if shared {
            if leaseDimensions.tokens { lease.tokens = Swift.max(0, lease.tokens - 1) }
        } else {
            bucket?.take()
        }
    }
}

/// A queue's ready operations in fair order (API.md "Fairness"): per priority level, the
/// fairness keys with a ready operation take turns by stride scheduling: the key with the
/// smallest `pass` goes next, and each start adds `1 / weight` to its key's pass. A key that
/// comes back after a pause joins at the level's current pass, so it cannot save up turns.
/// Within a key, oldest first. Entries go stale instead of being removed, as in the queue's heap.
struct FairReady {
    final class Key {
        let name: String
        let order: UInt64
        var heap: [UInt64] = []
        var pass: Double = 0
        var active = false
        init(name: String, order: UInt64) { self.name = name; self.order = order }
    }

    struct Level {
        var keys: [String: Key] = [:]
        /// Active keys, a min-heap by (pass, order).
        var active: [Key] = []
        var pass: Double = 0
    }

    var levels: [Level] = Array(repeating: Level(), count: 5)
    var nextOrder: UInt64 = 0

    mutating func push(_ op: OpRecord, key heapKey: UInt64) {
        let level = Int(heapKey >> 60)
        let name = op.options.fairnessKey ?? ""
        let k: Key
        if let found = levels[level].keys[name] {
            k = found
        } else {
            k = Key(name: name, order: nextOrder)
            nextOrder &+= 1
            levels[level].keys[name] = k
        }
        Self.heapPush(&k.heap, heapKey)
        if !k.active {
            k.active = true
            k.pass = Swift.max(k.pass, levels[level].pass)
            levels[level].active.append(k)
            siftUp(level, levels[level].active.count - 1)
        }
    }

    /// The next live ready operation in fair order, taken off (its key's turn is charged only
    /// when it starts: `charge`).
    mutating func pop(_ table: OpTable) -> OpRecord? {
        for level in 0..<5 {
            while let k = levels[level].active.first {
                while let top = k.heap.first {
                    Self.heapRemoveTop(&k.heap)
                    if let op = table[top & QueueRecord.idMask], op.heapKey == top, op.state == .ready {
                        op.heapKey = 0
                        return op
                    }
                }
                // Nothing ready under this key any more: it leaves the turns.
                // It rejoins at the level's pass, like a new key: memory stays bounded by the
                // keys with ready operations.
                k.active = false
                removeActiveTop(level)
                levels[level].keys[k.name] = nil
            }
        }
        return nil
    }

    /// `op` started: its key's turn is used.
    mutating func charge(_ op: OpRecord, weight: Int) {
        let level = Int(op.priority.rank)
        guard let k = levels[level].keys[op.options.fairnessKey ?? ""] else { return }
        levels[level].pass = Swift.max(levels[level].pass, k.pass)
        k.pass += 1 / Double(Swift.max(1, weight))
        guard k.active else { return }
        // Almost always the top: its operation was just taken off.
        if levels[level].active.first === k {
            siftDown(level, 0)
        } else if let i = levels[level].active.firstIndex(where: { $0 === k }) {
            siftDown(level, i)
        }
    }

    private static func less(_ a: Key, _ b: Key) -> Bool { a.pass < b.pass || (a.pass == b.pass && a.order < b.order) }

    private mutating func siftUp(_ level: Int, _ start: Int) {
        var i = start
        while i > 0 {
            let p = (i - 1) >> 1
            if !Self.less(levels[level].active[i], levels[level].active[p]) { break }
            levels[level].active.swapAt(i, p)
            i = p
        }
    }

    private mutating func siftDown(_ level: Int, _ start: Int) {
        var i = start
        let n = levels[level].active.count
        while true {
            let l = 2 * i + 1
            if l >= n { break }
            var c = l
            if l + 1 < n && Self.less(levels[level].active[l + 1], levels[level].active[l]) { c = l + 1 }
            if !Self.less(levels[level].active[c], levels[level].active[i]) { break }
            levels[level].active.swapAt(i, c)
            i = c
        }
    }

    private mutating func removeActiveTop(_ level: Int) {
        let last = levels[level].active.removeLast()
        if levels[level].active.isEmpty { return }
        levels[level].active[0] = last
        siftDown(level, 0)
    }

    /// A min-heap of keys in an array: the one used by the fair order and the parked operations.
    static func heapPush(_ heap: inout [UInt64], _ key: UInt64) {
        heap.append(key)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) >> 1
            if heap[parent] <= key { break }
            heap[i] = heap[parent]
            i = parent
        }
        heap[i] = key
    }

    static func heapRemoveTop(_ heap: inout [UInt64]) {
        let last = heap.removeLast()
        let n = heap.count
        if n == 0 { return }
        var i = 0
        while true {
            let l = 2 * i + 1
            if l >= n { break }
            var c = l
            if l + 1 < n && heap[l + 1] < heap[l] { c = l + 1 }
            if heap[c] >= last { break }
            heap[i] = heap[c]
            i = c
        }
        heap[i] = last
    }
}
