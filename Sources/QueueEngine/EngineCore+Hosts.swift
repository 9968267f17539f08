/// Hosts in the scheduler (API.md "Hosts"): operations whose kind names a target host start
/// only as its breaker allows. Ones it holds back are parked on it (`ParkingLot`), like on a
/// limiter key: they stay ready, keep their attempt and their order, and cost nothing while held.
/// Time moves the breaker (open → halfOpen, the ramp's seconds, a throttle's end) through one
/// wake-up per host, armed for the earliest of its deadlines.
public struct HostCounters: Sendable {
    /// Operations parked on a host that held them back.
    public var held: UInt64 = 0
    /// Answers that asked to slow down (429, or 503 with `Retry-After`).
    public var throttles: UInt64 = 0
    /// Times a breaker opened (from closed, or again after a canary or ramp failure).
    public var trips: UInt64 = 0
}

extension EngineCore {
    // MARK: - operations and their hosts

    /// The tracked host named `name`, made when it is new (nil when `--max-hosts` hosts are
    /// tracked and none can be forgotten: its operations then run without a breaker).
    func hostRecord(_ name: String, create: Bool = true) -> HostRecord? {
        if let h = hosts[name] { return h }
        guard create else { return nil }
        if hosts.count >= breaker.maxHosts {
            // A closed host with nothing held and nothing unfinished goes first.
            guard let gone = hosts.values.first(where: { $0.isForgettable }) else { return nil }
            hosts[gone.name] = nil
        }
        let h = HostRecord(name: name)
        hosts[name] = h
        return h
    }

    /// Resolves a new or restored unfinished operation's host (when its kind names one).
    func attachHost(_ op: OpRecord) {
        guard op.state != .finished, let name = op.kind.host(spec: op.spec), let h = hostRecord(name) else { return }
        op.host = h
        h.refs += 1
        if op.state == .ready { h.waiting += 1 }
    }

    /// `op` left `state`: a parked one is forgotten; a canary that stops without a verdict
    /// (paused, cancelled, timed out by the engine) lets the next one go.
    func hostLeft(_ op: OpRecord, _ h: HostRecord, _ state: OperationState) {
        switch state {
        case .ready:
            op.parkedOn?.forget(op)
            h.waiting -= 1
            // The held backlog is gone: the ramp is over.
            if h.waiting == 0 && h.state == .ramping && h.manual == nil { closeHost(h) }
        case .executing:
            if h.canary == op.id {
                h.canary = nil
                if h.hasParked { hostGotRoom(h) }
            }
        case .pending, .paused, .finished:
            break
        }
    }

    /// `op` moved into `state`: a ready one counts in the backlog; a finished one no longer
    /// keeps its host.
    func hostEntered(_ op: OpRecord, _ h: HostRecord, _ state: OperationState) {
        switch state {
        case .ready:
            h.waiting += 1
        case .finished:
            h.refs -= 1
            op.host = nil
        case .pending, .executing, .paused:
            break
        }
    }

    /// `op` leaves this engine unfinished (its queue went to another instance): its limiter keys
    /// and its host count it no more, as if it had finished here.
    func detachFlow(_ op: OpRecord) {
        if !op.limitKeys.isEmpty {
            flowLeft(op, op.state)
            flowEntered(op, .finished)
        }
        if let h = op.host {
            hostLeft(op, h, op.state)
            hostEntered(op, h, .finished)
        }
    }

    /// May `op` start now as far as its host goes? False parks it on the host.
    @inline(__always)
    func hostAdmits(_ op: OpRecord, _ h: HostRecord) -> Bool {
        if h.state == .closed && h.throttledUntil == nil && h.manual == nil { return true }
        refreshHost(h)
        if h.room(now: now.nanoseconds) > 0 { return true }
        h.park(op, ops)
        hostCounters.held &+= 1
        armHostWake(h)
        return false
    }

    // MARK: - what a run's end says about its host

    /// The kind's verdict on its host for the run of `op` that just ended (before the engine
    /// handles the completion). A request to slow down is handled by `hostThrottled`.
    func hostReport(_ op: OpRecord, _ h: HostRecord, _ verdict: HostVerdict, _ completion: Completion) {
        refreshHost(h)
        switch verdict {
        case .healthy:
            op.throttles = 0
            h.consecutiveFailures = 0
            h.throttleStreak = 0
            if h.canary == op.id {
                h.canary = nil
                if h.state == .halfOpen && h.manual == nil { startRamp(h) }
            }
        case .failure:
            op.throttles = 0
            h.consecutiveFailures += 1
            if case let .failed(type, detail, _) = completion {
                h.lastError = .object([("type", .string(type)), ("detail", .string(detail))])
            }
            let wasCanary = h.canary == op.id
            if wasCanary { h.canary = nil }
            guard h.manual == nil else { return }
            switch h.state {
            case .closed:
                if h.consecutiveFailures >= breaker.failures { openHost(h, again: false) }
            case .halfOpen:
                if wasCanary { openHost(h, again: true) }
            case .ramping:
                openHost(h, again: true)
            case .open:
                break
            }
        case .throttle:
            break
        }
    }

    /// The host of `op`'s run asked to slow down: the host waits until `retryAfter` (or 1 s
    /// doubled per such answer in a row, at most 300 s), and `op` goes back to ready without
    /// using an attempt. False when the answer counts as a failed attempt instead (the 21st in a
    /// row for this operation) or the operation is being cancelled.
    func hostThrottled(_ op: OpRecord, _ h: HostRecord, retryAfter: Double?) -> Bool {
        hostCounters.throttles &+= 1
        h.throttleStreak = min(h.throttleStreak + 1, 64)
        let fallback = min(BreakerSettings.maxThrottleSeconds, Double(1 << min(h.throttleStreak - 1, 20)))
        // A stated time is obeyed up to an hour (or the longest open time, when longer): a
        // target cannot hold its work for years.
        let cap = max(3600, breaker.maxOpenSeconds)
        let wait = retryAfter.map { $0.isFinite ? min(max(0, $0), cap) : cap } ?? fallback
        let until = now.nanoseconds.saturatingAdd(Int64(wait * 1e9))
        if until > (h.throttledUntil ?? .min) {
            h.throttledUntil = until
            h.revision += 1
            recordHost(h)
            armHostWake(h)
        }
        if h.canary == op.id { h.canary = nil }
        guard !op.isCancelled else { return false }
        if Int(op.throttles) >= BreakerSettings.maxThrottlesInARow {
            op.throttles = 0
            return false
        }
        op.throttles += 1
        holdRun(op)
        return true
    }

    /// Ends the current run of executing `op` without using an attempt: it waits again, ready
    /// (`OperationAction.hold`), and a late report of the run is ignored.
    func holdRun(_ op: OpRecord) {
        op.runToken &+= 1
        op.inBackoff = false
        op.backoffUntil = nil
        applyChecked(.hold, to: op)
        op.executedNanos = 0
        record(op)
    }

    // MARK: - the breaker's moves

    private func openHost(_ h: HostRecord, again: Bool) {
        h.reopenings = again ? min(h.reopenings + 1, 62) : 0
        var seconds = breaker.openSeconds
        for _ in 0..<h.reopenings where seconds < breaker.maxOpenSeconds { seconds *= 2 }
        seconds = min(seconds, breaker.maxOpenSeconds) * Double.random(in: 0.9...1.1)
        h.openedAt = now.nanoseconds
        h.until = now.nanoseconds.saturatingAdd(Int64(seconds * 1e9))
        h.canary = nil
        h.trips &+= 1
        hostCounters.trips &+= 1
        setHostState(h, .open)
        armHostWake(h)
    }

    private func startRamp(_ h: HostRecord) {
        h.rampStart = now.nanoseconds
        h.rampSecond = -1
        h.rampStarted = 0
        h.until = now.nanoseconds.saturatingAdd(Int64(BreakerSettings.rampSeconds) * 1_000_000_000)
        setHostState(h, .ramping)
        if h.waiting == 0 {
            closeHost(h)
        } else {
            hostGotRoom(h)
        }
    }

    func closeHost(_ h: HostRecord) {
        h.reopenings = 0
        h.consecutiveFailures = 0
        h.until = nil
        h.canary = nil
        setHostState(h, .closed)
        if h.hasParked { hostGotRoom(h) }
    }

    /// Moves `h` to `state` (an event and a stored record when it changes).
    func setHostState(_ h: HostRecord, _ state: BreakerState) {
        let old = h.state
        h.state = state
        h.revision += 1
        if old != state { emitHost(h, old, state) }
        recordHost(h)
    }

    /// The moves time makes: a throttle or a hand setting that ran out, an open host whose
    /// time is up (halfOpen), a ramp past its minute (closed).
    func refreshHost(_ h: HostRecord) {
        let t = now.nanoseconds
        if let until = h.throttledUntil, t >= until { h.throttledUntil = nil }
        if let m = h.manual, let until = m.until, t >= until.nanoseconds {
            h.manual = nil
            if m.breaker == .open {
                h.until = nil
                setHostState(h, .halfOpen)
            } else {
                h.revision += 1
                recordHost(h)
            }
        }
        guard h.manual == nil else { return }
        if h.state == .open, let until = h.until, t >= until {
            // Its open period is over: halfOpen has no end of its own.
            h.until = nil
            setHostState(h, .halfOpen)
        } else if h.state == .ramping, let until = h.until, t >= until {
            closeHost(h)
        }
    }

    /// `h` may have room: as many of its parked operations as it has room for go back to
    /// their queues' ready order, in its order (priority, then age). Unlike a limiter key's,
    /// room one of them cannot use now (its queue is full or suspended) is not passed on at
    /// once: the host's bound counts starts, and one let go that cannot start yet keeps its
    /// place in its queue and is checked again when it can (parked again if the host then
    /// has no room). Passing the room on would let every held operation go into queues that
    /// are full.
    func hostGotRoom(_ h: HostRecord) {
        refreshHost(h)
        if h.state == .halfOpen && !h.forcedClosed && h.canary == nil && h.room(now: now.nanoseconds) > 0 {
            letCanaryGo(h)
            armHostWake(h)
            return
        }
        var room = min(h.room(now: now.nanoseconds), h.parkedCount)
        while room > 0, let op = h.unpark(ops) {
            op.queue.push(op)
            dirty.append(op.queue)
            room -= 1
        }
        armHostWake(h)
    }

    /// halfOpen: the first held operation (priority, then age) whose queue can start it now goes
    /// as the canary; ones whose queue is suspended or full keep their place (up to 64 are
    /// looked at; if none can go, the host looks again in a second).
    private func letCanaryGo(_ h: HostRecord) {
        var passed: [OpRecord] = []
        var chosen: OpRecord?
        while chosen == nil, passed.count < 64, let op = h.unpark(ops) {
            let q = op.queue
            if !q.deleted && !q.isSuspended && q.executing < limit(q) { chosen = op } else { passed.append(op) }
        }
        for op in passed { h.park(op, ops) }
        if let op = chosen {
            op.queue.push(op)
            dirty.append(op.queue)
        }
    }

    /// Arms the host's wake-up for its earliest deadline ahead, unless one as early is armed.
    func armHostWake(_ h: HostRecord) {
        let t = now.nanoseconds
        var at = Int64.max
        if let u = h.throttledUntil, u > t { at = min(at, u) }
        if let u = h.manual?.until?.nanoseconds, u > t { at = min(at, u) }
        if h.manual == nil, h.state == .open || h.state == .ramping, let u = h.until { at = min(at, max(u, t)) }
        // halfOpen with no canary running: look again in a second (the first held operation's
        // queue may be suspended or full now).
        if h.state == .halfOpen && h.canary == nil && h.hasParked && !h.forcedClosed { at = min(at, t.saturatingAdd(1_000_000_000)) }
        if h.state == .ramping && h.hasParked {
            let k = max(0, t.saturatingSubtract(h.rampStart) / 1_000_000_000)
            at = min(at, h.rampStart.saturatingAdd((k + 1) * 1_000_000_000))
        }
        guard at != .max, at < h.wakeAt || h.wakeAt <= t else { return }
        h.wakeAt = at
        h.wakeGeneration &+= 1
        effects.append(.flowWake(.host(h.name, generation: h.wakeGeneration), seconds: Double(at.saturatingSubtract(t)) / 1e9))
    }

    /// A host's wake-up fired.
    func hostWakeFired(_ name: String, generation: UInt64) {
        guard let h = hosts[name], h.wakeGeneration == generation else { return }
        h.wakeAt = .max
        refreshHost(h)
        if h.hasParked { hostGotRoom(h) } else { armHostWake(h) }
    }

    // MARK: - events and records

    func emitHost(_ h: HostRecord, _ old: BreakerState, _ new: BreakerState) {
        let e = ChangeEvent(
            seq: nextSeq, time: now, queue: h.name, operation: OperationID(raw: 0), key: .breaker, old: .breaker(old), new: .breaker(new),
            state: .ready)
        nextSeq += 1
        outEvents.append(e)
        if wantsRecords { outRecords.append(.event(e)) }
    }

    func recordHost(_ h: HostRecord) {
        ticket &+= 1
        if wantsRecords { outRecords.append(.host(h.snapshot())) }
    }

    /// Why `op` waits for its host now, if it does.
    func hostReason(_ op: OpRecord) -> WaitReason? {
        guard let h = op.host else { return nil }
        // Read only (statuses are answered under a read): the moves time makes wait for the
        // host's own wake-up.
        let t = now.nanoseconds
        guard op.parkedOn === h || h.room(now: t) == 0 else { return nil }
        let (state, until) = h.waitState(now: t)
        return .host(host: h.name, state: state, until: until.map(Timestamp.init(nanoseconds:)))
    }
}
