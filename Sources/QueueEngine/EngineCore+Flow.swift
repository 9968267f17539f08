/// Flow control in the scheduler (API.md "Flow control"): a queue's rate, limiters per key,
/// and the parking of ready operations a key has no room for.
///
/// The next start in a queue is the highest-priority, oldest ready operation (in fair order
/// when the queue has fairness keys) whose limits all have room. One whose limiter key has no
/// room is *parked* on that key: taken off its queue's ready order, it costs nothing while it
/// waits. The key puts it back (O(log n)) when it gets room: a running operation of that key
/// stops executing, its bucket refills (one timer per key), or its limiter's settings change.
/// Blocked operations are never scanned.
/// Counts of flow control since the start (`/metrics`).
public struct FlowCounters: Sendable {
    /// Starts held back by a queue's rate limit (each start counted once).
    public var delayedByQueueRate: UInt64 = 0
    /// Starts held back by a limiter key's rate (each start counted once).
    public var delayedByLimiterRate: UInt64 = 0
    /// Operations parked on a limiter key without room.
    public var parked: UInt64 = 0
}

extension EngineCore {
    /// Where a flow timer points (`Effect.flowWake`).
    enum FlowWake {
        case queue(String, generation: UInt64)
        case key(limiter: String, key: String, generation: UInt64)
        case host(String, generation: UInt64)
        case schedules(generation: UInt64)
        /// Changed history buckets go to the store.
        case history
    }

    // MARK: - limits of an operation

    /// The checks of `limits` that need the engine's state: every limiter exists, and the keys
    /// that would be new fit under `--max-limiter-keys` (`pending`: keys that earlier elements of
    /// the same batch add, by limiter). `field` prefixes the names in a refusal.
    func checkLimits(_ limits: [LimitRef], field: String = "limits", pending: inout [String: Set<String>]) throws(EngineError) {
        for (i, ref) in limits.enumerated() {
            guard let l = limiters[ref.limiter] else {
                throw .invalidArgument(field: "\(field)[\(i)].limiter", detail: "no limiter named '\(ref.limiter)'; create it with POST /v1/limiters first")
            }
            if l.keys[ref.key] != nil || pending[ref.limiter]?.contains(ref.key) == true { continue }
            let max = engine.configuration.maxLimiterKeys
            let adding = pending[ref.limiter]?.count ?? 0
            // At most one sweep a second per limiter: a client at the limit must not make
            // every create walk every key.
            if l.keys.count + adding >= max, now.nanoseconds.saturatingSubtract(l.lastSweep) >= 1_000_000_000 {
                l.lastSweep = now.nanoseconds
                sweepIdleKeys(l)
            }
            guard l.keys.count + adding < max else {
                throw .limitReached(
                    "limiter '\(l.name)' has \(l.keys.count) keys in use, the most allowed (--max-limiter-keys \(max)); key '\(ref.key)' would be one more",
                    limit: "too-many-limiter-keys")
            }
            pending[ref.limiter, default: []].insert(ref.key)
        }
    }

    /// Forgets the keys nothing names, nothing runs under, and whose bucket is full.
    func sweepIdleKeys(_ l: LimiterRecord) {
        let t = now.nanoseconds
        for (name, k) in l.keys where k.isIdle(now: t) { l.keys[name] = nil }
    }

    /// Resolves a new or restored operation's limits to their keys and counts it in them (by
    /// its state now). Limits were checked (`checkLimits`); one whose limiter is gone (a
    /// damaged store) is left out.
    func attachFlow(_ op: OpRecord) {
        let limits = op.options.limits
        guard !limits.isEmpty else { return }
        var keys: [LimiterKey] = []
        keys.reserveCapacity(limits.count)
        for ref in limits {
            guard let l = limiters[ref.limiter] else { continue }
            let k: LimiterKey
            if let found = l.keys[ref.key] {
                k = found
            } else {
                k = LimiterKey(limiter: l, key: ref.key, shared: sharedLimiters)
                l.keys[ref.key] = k
            }
            keys.append(k)
        }
        op.limitKeys = keys
        guard op.state != .finished else { op.limitKeys = []; return }
        for k in keys {
            k.refs += 1
            k.limiter.refs += 1
        }
        flowEntered(op, op.state)
        // Restored executing (a restart, a queue taken over): it runs already; its slot is
        // asked for at once, and nothing more starts under the key until it is granted.
        if op.state == .executing { for k in keys where k.shared { askLease(k) } }
    }

    /// `op` moved into `state`: the keys' running and waiting counts follow.
    func flowEntered(_ op: OpRecord, _ state: OperationState) {
        switch state {
        case .ready:
            for k in op.limitKeys {
                k.waiting += 1
                k.limiter.waiting += 1
            }
        case .executing:
            for k in op.limitKeys {
                k.running += 1
                k.limiter.running += 1
            }
        case .finished:
            for k in op.limitKeys {
                k.refs -= 1
                k.limiter.refs -= 1
                if k.refs == 0 && k.isIdle(now: now.nanoseconds) { k.limiter.keys[k.key] = nil }
            }
            // A finished operation holds on to no key.
            op.limitKeys = []
        case .pending, .paused:
            break
        }
    }

    /// `op` left `state`: a ready one that was parked is forgotten by its key; a running one
    /// frees its slot, which may let a parked operation go back to its queue.
    func flowLeft(_ op: OpRecord, _ state: OperationState) {
        switch state {
        case .ready:
            op.parkedOn?.forget(op)
            for k in op.limitKeys {
                k.waiting -= 1
                k.limiter.waiting -= 1
            }
        case .executing:
            for k in op.limitKeys {
                k.running -= 1
                k.limiter.running -= 1
                if k.hasParked {
                    keyGotRoom(k)
                } else if k.shared && k.lease.slots > k.running {
                    // Slots this instance no longer uses go back to the shared budget.
                    askLease(k)
                }
            }
        case .pending, .paused, .finished:
            break
        }
    }

    // MARK: - the start decision

    /// Starts ready operations while the queue has free slots and tokens. Only ready,
    /// unparked operations are looked at (a heap per queue); an operation a limiter key holds
    /// back is parked once and not looked at again until the key has room.
    func schedule(_ q: QueueRecord) {
        if q.deleted { return }
        while !q.isSuspended && q.executing < limit(q), let op = q.popReady(ops) {
            // A resume continues a run: it takes a slot, not a token (API.md "A start").
            let counts = !op.resumeOnStart
            if counts, q.rate?.has(now.nanoseconds) == false {
                if !op.rateDelayed {
                    op.rateDelayed = true
                    flowCounters.delayedByQueueRate &+= 1
                }
                q.push(op)
                armRateWake(q)
                return
            }
            // A host that is not closed holds every start to it, resumes too.
            if let h = op.host, !hostAdmits(op, h) { continue }
            if !op.limitKeys.isEmpty {
                if let k = blockingKey(op, counts: counts) {
                    park(op, on: k)
                    continue
                }
                if counts {
                    for k in op.limitKeys { k.takeStart() }
                }
            }
            op.host?.takeStart(op)
            if counts { q.rate?.take() }
            op.rateDelayed = false
            q.fair?.charge(op, weight: q.fairnessWeights[op.options.fairnessKey ?? ""] ?? 1)
            startOp(op)
        }
    }

    /// The first key of `op` without room for it now; nil when all have room. `counts`: the
    /// start takes tokens (a resume takes only a slot).
    private func blockingKey(_ op: OpRecord, counts: Bool) -> LimiterKey? {
        let t = now.nanoseconds
        for k in op.limitKeys {
            guard let why = k.blocked(now: t) else { continue }
            if why == .rate && !counts { continue }
            return k
        }
        return nil
    }

    private func park(_ op: OpRecord, on k: LimiterKey) {
        k.park(op, ops)
        flowCounters.parked &+= 1
        if k.shared {
            // The shared budget is asked; its answer lets the key's operations go.
            askLease(k)
            return
        }
        // A key held back by its rate alone comes back by itself when a token is there.
        if k.blocked(now: now.nanoseconds) == .rate {
            if !op.rateDelayed {
                op.rateDelayed = true
                flowCounters.delayedByLimiterRate &+= 1
            }
            armKeyWake(k)
        }
    }

    /// `k` may have room: as many of its parked operations as it has room for go back to
    /// their queues' ready order (each queue then starts what it can).
    func keyGotRoom(_ k: LimiterKey) {
        let t = now.nanoseconds
        var room = min(k.room(now: t), k.parkedCount)
        var letGo = 0
        while room > 0, let op = k.unpark(ops) {
            op.queue.push(op)
            dirty.append(op.queue)
            room -= 1
            letGo += 1
        }
        if letGo > 0 && !k.rechecking && k.hasParked {
            k.rechecking = true
            flowRecheck.append(k)
        }
        if k.shared {
            if k.hasParked { askLease(k) }
            return
        }
        // Those let go take the tokens there are: the ones still parked need the token after.
        if k.hasParked, let b = k.bucket, k.budget.concurrency.map({ k.running < $0 }) ?? true {
            let short = Double(letGo + 1) - b.tokens
            armKeyWake(k, seconds: max(0, short / b.limit.perSecond))
        }
    }

    private func armRateWake(_ q: QueueRecord) {
        guard !q.rateWakeArmed, let b = q.rate else { return }
        q.rateWakeArmed = true
        effects.append(.flowWake(.queue(q.name, generation: q.rateWakeGeneration), seconds: b.untilToken.asSeconds))
    }

    private func armKeyWake(_ k: LimiterKey, seconds: Double? = nil) {
        guard !k.wakeArmed, let b = k.bucket else { return }
        k.wakeArmed = true
        effects.append(.flowWake(.key(limiter: k.limiter.name, key: k.key, generation: k.wakeGeneration), seconds: seconds ?? b.untilToken.asSeconds))
    }

    /// A flow timer fired: the queue or key looks again.
    func flowWakeFired(_ wake: FlowWake) {
        switch wake {
        case let .queue(name, generation):
            guard let q = queues[name], q.rateWakeGeneration == generation else { return }
            q.rateWakeArmed = false
            dirty.append(q)
        case let .key(limiter, key, generation):
            guard let k = limiters[limiter]?.keys[key], k.wakeGeneration == generation else { return }
            k.wakeArmed = false
            keyGotRoom(k)
        case let .host(name, generation):
            hostWakeFired(name, generation: generation)
        case let .schedules(generation):
            schedulesWakeFired(generation)
        case .history:
            flushHistory()
        }
    }

    /// A retried operation's next attempt is a start too: it waits, still executing, until its
    /// queue's and its keys' buckets have a token. Nanoseconds to wait, or 0 when the tokens
    /// were taken and the attempt may begin; -1 when its host holds starts: the operation was
    /// put back to ready (`holdRun`) and waits for the host there.
    func attemptWait(_ op: OpRecord) -> Int64 {
        let t = now.nanoseconds
        if let h = op.host {
            refreshHost(h)
            // Its host holds starts: the attempt waits parked on it, ready (its attempt number kept).
            if h.room(now: t) == 0 {
                holdRun(op)
                return -1
            }
        }
        var wait: Int64 = 0
        if var b = op.queue.rate {
            if !b.has(t) { wait = max(wait, b.untilToken) }
            op.queue.rate = b
        }
        for k in op.limitKeys {
            if k.shared {
                // Asked for, and looked at again shortly.
                if k.leaseDimensions.tokens && k.currentTokens(t) < 1 {
                    askLease(k)
                    wait = max(wait, 100_000_000)
                }
                continue
            }
            guard k.budget.rate != nil else { continue }
            k.syncBucket(now: t)
            if k.bucket?.has(t) == false { wait = max(wait, k.bucket?.untilToken ?? 0) }
        }
        guard wait == 0 else { return wait }
        op.queue.rate?.take()
        for k in op.limitKeys { k.takeStart() }
        op.host?.takeStart(op)
        return 0
    }

    // MARK: - why it waits

    /// Everything that holds `op` back now (API.md `waitingOn`), from the engine's own state.
    func waitingOn(_ op: OpRecord) -> [WaitReason] {
        var out: [WaitReason] = []
        let q = op.queue
        let t = now.nanoseconds
        switch op.state {
        case .finished:
            return []
        case .executing:
            guard op.inBackoff else { return [] }
            if let until = op.backoffUntil, until > now {
                out.append(.backoff(until: until))
            } else {
                out.append(contentsOf: tokenReasons(op, t))
            }
            return out
        case .pending, .ready, .paused:
            break
        }
        if op.unfinishedDependencies > 0 { out.append(.dependencies(count: op.unfinishedDependencies)) }
        if op.state == .paused { out.append(.paused) }
        // Paused between attempts: its next attempt is still due then.
        if let until = op.backoffUntil, until > now { out.append(.backoff(until: until)) }
        if op.waitingForTime, let nb = op.options.notBefore { out.append(.notBefore(until: nb)) }
        if q.isSuspended { out.append(.suspended) }
        guard op.state == .ready else { return out }
        if q.executing >= limit(q) { out.append(.concurrency) }
        if let h = hostReason(op) { out.append(h) }
        out.append(contentsOf: tokenReasons(op, t, slots: true))
        return out
    }

    /// The queue's rate and the limiter keys that lack room for `op` now (`slots`: concurrency
    /// too, for an operation that needs a slot).
    private func tokenReasons(_ op: OpRecord, _ t: Int64, slots: Bool = false) -> [WaitReason] {
        var out: [WaitReason] = []
        if var b = op.queue.rate, !op.resumeOnStart {
            if !b.has(t) { out.append(.rate(until: Timestamp(nanoseconds: b.last.saturatingAdd(b.untilToken)))) }
        }
        for k in op.limitKeys {
            if k.shared {
                if let why = k.blocked(now: t), slots || why == .rate, why == .concurrency || !op.resumeOnStart {
                    out.append(.limiter(name: k.limiter.name, key: k.key, reason: why, until: nil))
                }
                continue
            }
            let budget = k.budget
            if slots, let c = budget.concurrency, k.running >= c {
                out.append(.limiter(name: k.limiter.name, key: k.key, reason: .concurrency, until: nil))
            }
            if budget.rate != nil, !op.resumeOnStart {
                k.syncBucket(now: t)
                if var b = k.bucket, !b.has(t) {
                    out.append(
                        .limiter(name: k.limiter.name, key: k.key, reason: .rate, until: Timestamp(nanoseconds: b.last.saturatingAdd(b.untilToken))))
                }
            }
        }
        return out
    }

    /// The operation's status as the API answers it: its snapshot with `waitingOn`.
    func status(_ op: OpRecord) -> OperationSnapshot {
        var s = op.snapshot()
        if op.state != .finished { s.waitingOn = waitingOn(op) }
        return s
    }
}
