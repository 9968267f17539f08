extension QueueEngine {
    // MARK: - hosts (API.md "Hosts")

    /// Every tracked host, by name.
    public func hosts() -> [HostSnapshot] {
        (try? mutate { core throws(EngineError) in
            core.hosts.values.map { h in
                core.refreshHost(h)
                return h.snapshot()
            }.sorted { $0.host < $1.host }
        }) ?? []
    }

    /// One tracked host; `hostNotFound` for a host never used or set.
    public func host(named name: String) throws(EngineError) -> HostSnapshot {
        try mutate { core throws(EngineError) in
            guard let h = core.hosts[name] else { throw .hostNotFound(name) }
            core.refreshHost(h)
            return h.snapshot()
        }
    }

    /// Sets a host's breaker by hand: `open` (until `until`, or until `auto`), `closed` (at
    /// once: no canary, no ramp, no tripping, until `until` or `auto`), or nil for `auto` (back
    /// to the automatic rules; from a hand open it goes on as halfOpen). A host not used yet is
    /// tracked from then on.
    @discardableResult
    public func setHost(_ name: String, breaker: BreakerState?, until: Timestamp? = nil, reason: String? = nil) throws(EngineError) -> HostSnapshot {
        try mutate { core throws(EngineError) in
            guard let h = core.hostRecord(name) else {
                throw .limitReached(
                    "at most \(core.breaker.maxHosts) hosts are tracked (--max-hosts) and none can be forgotten now", limit: "too-many-hosts")
            }
            core.refreshHost(h)
            switch breaker {
            case .open?:
                h.manual = HostManual(breaker: .open, until: until, reason: reason)
                h.canary = nil
                if h.state != .open { h.openedAt = core.now.nanoseconds }
                h.until = until?.nanoseconds
                core.setHostState(h, .open)
            case .closed?:
                h.manual = HostManual(breaker: .closed, until: until, reason: reason)
                h.throttledUntil = nil
                h.throttleStreak = 0
                core.closeHost(h)
            case nil:
                let was = h.manual
                h.manual = nil
                if was?.breaker == .open {
                    h.until = nil
                    core.setHostState(h, .halfOpen)
                } else {
                    h.revision += 1
                    core.recordHost(h)
                }
            case .halfOpen?, .ramping?:
                throw .invalidArgument(field: "breaker", detail: "must be one of open, closed, auto")
            }
            if h.hasParked { core.hostGotRoom(h) } else { core.armHostWake(h) }
            return h.snapshot()
        }
    }

    /// Takes another instance's newer state of a host (a cluster: one host, one state), read
    /// from the shared store after its change was seen in the feed.
    public func adoptHost(_ s: HostSnapshot) {
        try? mutate { core throws(EngineError) in
            guard let h = core.hostRecord(s.host), s.revision > h.revision else { return }
            let old = h.state
            h.adopt(s, now: core.now.nanoseconds)
            if old == .closed && h.state == .open { h.trips &+= 1 }
            if h.hasParked { core.hostGotRoom(h) } else { core.armHostWake(h) }
        }
    }

    /// Counts for `/metrics`: the totals, and per host its state and held operations.
    public func hostMetrics() -> (counters: HostCounters, hosts: [(host: String, state: BreakerState, held: Int, trips: UInt64)]) {
        state.withLock { core in
            (core.hostCounters, core.hosts.values.map { ($0.name, $0.state, $0.parkedCount, $0.trips) })
        }
    }
}

extension EngineCore {
    /// A stored host comes back as it was: an open host stays open until its time (then
    /// halfOpen), a ramp starts again.
    /// (A cluster instance taking partitions reads every host again: one it already knows in a
    /// newer or the same revision stays as it is.)
    func restoreHost(_ s: HostSnapshot) {
        if let known = hosts[s.host], known.revision >= s.revision { return }
        guard let h = hostRecord(s.host) else { return }
        h.adopt(s, now: now.nanoseconds)
        if h.hasParked { hostGotRoom(h) } else { armHostWake(h) }
    }
}
