/// A host's breaker under the engine's lock (API.md "Hosts"), with the ready operations it
/// holds parked on it in their start order (priority, then age), across queues.
final class HostRecord: ParkingLot, @unchecked Sendable {  // guarded by the engine lock
    let name: String
    var state: BreakerState = .closed
    var consecutiveFailures = 0
    var openedAt: Int64?
    /// While open: when it goes halfOpen (nil: open by hand with no end). While ramping: when
    /// the ramp ends at the latest.
    var until: Int64?
    var throttledUntil: Int64?
    /// Requests to slow down in a row without a `Retry-After`, for the doubling wait.
    var throttleStreak = 0
    var lastError: JSONValue?
    var manual: HostManual?
    var reopenings = 0
    var revision: UInt64 = 1
    var trips: UInt64 = 0
    /// The canary of the halfOpen state, while it runs.
    var canary: UInt64?
    /// When the ramp began, the second of it now (k) and the starts made in that second.
    var rampStart: Int64 = 0
    var rampSecond: Int64 = -1
    var rampStarted = 0
    /// Unfinished operations to it: while any are, it is not forgotten.
    var refs = 0
    /// Ready operations to it (parked here or let go to their queues and not started yet): the
    /// held backlog a ramp runs until it is gone.
    var waiting = 0
    /// A wake-up is armed for `wakeAt`; `wakeGeneration` names the current one.
    var wakeAt: Int64 = .max
    var wakeGeneration: UInt64 = 0

    init(name: String) {
        self.name = name
        super.init()
    }

    /// Forced closed by hand: no canary, no ramp, no tripping.
    var forcedClosed: Bool { manual?.breaker == .closed }

    /// How many more operations to it may start now (`Int.max`: no bound). Time-driven moves
    /// (`EngineCore.refreshHost`) are made before this is asked.
    func room(now: Int64) -> Int {
        if let t = throttledUntil, now < t { return 0 }
        if forcedClosed { return .max }
        switch state {
        case .closed: return .max
        case .open: return 0
        case .halfOpen: return canary == nil ? 1 : 0
        case .ramping:
            let k = Swift.max(0, now.saturatingSubtract(rampStart) / 1_000_000_000)
            if k != rampSecond {
                rampSecond = k
                rampStarted = 0
            }
            guard k < 62 else { return .max }
            return Swift.max(0, (1 << Int(k)) - rampStarted)
        }
    }

    /// An operation to it starts.
    func takeStart(_ op: OpRecord) {
        if forcedClosed { return }
        switch state {
        case .halfOpen: canary = op.id
        case .ramping: rampStarted += 1
        case .closed, .open: break
        }
    }

    /// What it is for an operation held back by it (`waitingOn`).
    func waitState(now: Int64) -> (String, Int64?) {
        if !forcedClosed {
            switch state {
            case .open: return ("open", until)
            case .halfOpen where canary != nil: return ("halfOpen", nil)
            case .ramping: return ("ramping", nil)
            case .closed, .halfOpen: break
            }
        }
        if let t = throttledUntil, now < t { return ("throttled", t) }
        return (state.rawValue, nil)
    }

    /// Nothing to it is unfinished, nothing is held, it is closed and not set by hand.
    var isForgettable: Bool { refs == 0 && !hasParked && state == .closed && manual == nil && canary == nil }

    func snapshot() -> HostSnapshot {
        var s = HostSnapshot(
            host: name, state: state, held: parkedCount, consecutiveFailures: consecutiveFailures,
            openedAt: openedAt.map(Timestamp.init(nanoseconds:)), until: until.map(Timestamp.init(nanoseconds:)),
            throttledUntil: throttledUntil.map(Timestamp.init(nanoseconds:)), lastError: lastError, manual: manual,
            reopenings: reopenings, revision: revision)
        s.trips = trips
        return s
    }

    /// Takes a stored or another instance's state (the engine's own counts stay).
    func adopt(_ s: HostSnapshot, now: Int64) {
        state = s.state
        consecutiveFailures = s.consecutiveFailures
        openedAt = s.openedAt?.nanoseconds
        until = s.until?.nanoseconds
        throttledUntil = s.throttledUntil?.nanoseconds
        lastError = s.lastError
        manual = s.manual
        reopenings = s.reopenings
        revision = s.revision
        canary = nil
        if state == .ramping {
            // A ramp seen from outside (a restart, another instance) starts again here.
            rampStart = now
            rampSecond = -1
            rampStarted = 0
        }
    }
}
