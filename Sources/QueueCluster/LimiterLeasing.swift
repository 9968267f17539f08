import Dispatch
import Locking
import Logging
import PostgresStore
import QueueEngine

/// The shared budgets of limiters, where a cluster keeps them (PostgreSQL: `PGLimiterLeases`).
package protocol LeaseExchange: Sendable {
    /// One exchange for many keys: each key's holding set to what it keeps and wants, within
    /// the budget, and tokens taken.
    func exchange(_ needs: [LimiterLeaseNeed]) throws -> [LimiterLeaseGrant]
    /// Extends this instance's holdings (they lapse after a lease: an instance that stops
    /// without giving them back holds them no longer than that); answers what it still holds.
    func renew() throws -> [(limiter: String, key: String, slots: Int)]
    /// Gives every holding back (a clean stop).
    func releaseAll() throws
    /// Forgets lapsed holdings and idle buckets of every instance, a bounded number at a time.
    func prune() throws
}

/// An engine's lease client (`LimiterLeaseClient`): wants are gathered for a moment and sent
/// in one exchange; a key still short afterwards asks again a little later (other instances
/// give slots back, buckets refill), and holdings are renewed a few times per lease, on a queue
/// of their own so that exchanges never delay a renewal.
package final class LimiterLeasing: LimiterLeaseClient, Sendable {
    private struct State {
        var wanted: Set<Pair> = []
        var flushing = false
        var stopped = false
    }

    private struct Pair: Hashable, Comparable {
        let limiter: String
        let key: String
        static func < (a: Pair, b: Pair) -> Bool {
            a.limiter == b.limiter ? a.key.utf8.lexicographicallyPrecedes(b.key.utf8) : a.limiter.utf8.lexicographicallyPrecedes(b.limiter.utf8)
        }
    }

    private let state = Lock(State())
    private let store: any LeaseExchange
    private let queue = DispatchQueue(label: "opqd.limiter-leases")
    private let renewals = DispatchQueue(label: "opqd.limiter-lease-renewals")
    private let leaseSeconds: Double
    private let logger: Logger
    /// Set once, before any want (`attach`).
    private let engineBox = Lock<QueueEngine?>(nil)

    package init(store: any LeaseExchange, leaseSeconds: Double, logger: Logger) {
        self.store = store
        self.leaseSeconds = leaseSeconds
        self.logger = logger
    }

    /// Makes `engine` lease its limiters' budgets here, and starts renewing.
    package func attach(to engine: QueueEngine) {
        engineBox.withLock { $0 = engine }
        engine.setLeaseClient(self, leaseSeconds: leaseSeconds)
        scheduleRenewal()
    }

    package func want(limiter: String, key: String) {
        let start = state.withLock { s -> Bool in
            if s.stopped { return false }
            s.wanted.insert(Pair(limiter: limiter, key: key))
            if s.flushing { return false }
            s.flushing = true
            return true
        }
        // A millisecond to gather the wants of one burst of changes into one exchange.
        if start { queue.asyncAfter(deadline: .now() + .milliseconds(1)) { [self] in flush() } }
    }

    /// One exchange of what is wanted (at most 256 keys), then the next pass on the queue: a
    /// key that wants again meanwhile waits its turn behind the others (and the renewals).
    private func flush() {
        guard let engine = engineBox.withLock({ $0 }) else { return }
        let pairs = state.withLock { s -> [Pair] in
            if s.stopped {
                s.flushing = false
                return []
            }
            let p = Array(s.wanted.sorted().prefix(256))
            for x in p { s.wanted.remove(x) }
            return p
        }
        if !pairs.isEmpty {
            let sentAt = SystemClock().now()
            let needs = engine.leaseNeeds(pairs.map { ($0.limiter, $0.key) })
            do {
                let grants = try store.exchange(needs)
                let short = Set(engine.leaseGranted(grants, sentAt: sentAt).map { Pair(limiter: $0.limiter, key: $0.key) })
                // Short of slots: other instances hold them, and give them back as their
                // operations finish; short of tokens: the bucket refills at its rate.
                for g in grants where short.contains(Pair(limiter: g.limiter, key: g.key)) {
                    let delay = g.rate.map { max(0.005, min(0.1, 1 / $0.perSecond)) } ?? 0.05
                    later(delay, [Pair(limiter: g.limiter, key: g.key)])
                }
            } catch {
                logger.warning("limiter leases: exchange failed, retrying in 0.5 s: \(error)")
                // Nothing was granted: the keys keep what they held (within their lease, and
                // within what the lost exchange asked for) and ask again.
                later(0.5, pairs)
            }
        }
        let more = state.withLock { s -> Bool in
            if s.wanted.isEmpty || s.stopped {
                s.flushing = false
                return false
            }
            return true
        }
        if more { queue.async { [self] in flush() } }
    }

    private func later(_ seconds: Double, _ pairs: [Pair]) {
        queue.asyncAfter(deadline: .now() + .milliseconds(Int(max(1, seconds * 1000)))) { [self] in
            for p in pairs { want(limiter: p.limiter, key: p.key) }
        }
    }

    private func scheduleRenewal(_ round: Int = 0) {
        let every = max(0.1, leaseSeconds / 3)
        renewals.asyncAfter(deadline: .now() + .milliseconds(Int(every * 1000))) { [self] in
            if state.withLock({ $0.stopped }) { return }
            let sentAt = SystemClock().now()
            do {
                let held = try store.renew()
                if let engine = engineBox.withLock({ $0 }) {
                    // Keys whose rows are gone hold nothing now; rows the engine does not know go back.
                    for p in engine.leaseRenewed(held, sentAt: sentAt) { want(limiter: p.limiter, key: p.key) }
                }
            } catch {
                logger.warning("limiter leases: renewal failed: \(error)")
            }
            // Now and then, the rows nobody uses any more (lapsed holdings, full idle buckets).
            if round % 30 == 29 {
                do { try store.prune() } catch { logger.warning("limiter leases: pruning failed: \(error)") }
            }
            scheduleRenewal(round &+ 1)
        }
    }

    /// Gives every holding back and stops asking (a clean stop, after the last start): an
    /// exchange already under way ends first, and none follows.
    package func stop() {
        state.withLock { $0.stopped = true }
        queue.sync {}
        renewals.sync {}
        do { try store.releaseAll() } catch { logger.warning("limiter leases: could not give the holdings back (they lapse after a lease): \(error)") }
    }
}

/// The limiters every instance of a cluster shares, read from their committed rows.
package struct PostgresLimiterDirectory: LimiterDirectory {
    let pool: PGReadPool
    package init(pool: PGReadPool) { self.pool = pool }
    package func limiter(named name: String) throws -> LimiterSnapshot? { try pool.limiter(named: name) }
    package func limiters() throws -> [LimiterSnapshot] { try pool.limiters() }
    package func operationsNaming(limiter name: String) throws -> Int { try pool.operationsNaming(limiter: name) }
}

/// The shared budgets in PostgreSQL (`PGLimiterLeases`, schema 11) as the lease client uses them.
package struct PostgresLeaseExchange: LeaseExchange {
    let leases: PGLimiterLeases
    package init(_ leases: PGLimiterLeases) { self.leases = leases }

    package func exchange(_ needs: [LimiterLeaseNeed]) throws -> [LimiterLeaseGrant] {
        let grants = try leases.exchange(
            needs.map { LeaseRequest(limiter: $0.limiter, key: $0.key, keepSlots: $0.keepSlots, wantSlots: $0.wantSlots, wantTokens: $0.wantTokens) })
        return grants.map { g in
            if case .damaged = g.refusal {
                // A row opqd could not have written: nothing starts under it (no slot of none).
                return LimiterLeaseGrant(limiter: g.limiter, key: g.key, slots: 0, tokens: 0, concurrency: 0, rate: nil)
            }
            // A limiter that is gone limits nothing any more, as after a restart.
            return LimiterLeaseGrant(limiter: g.limiter, key: g.key, slots: g.slots, tokens: g.tokens, concurrency: g.concurrency, rate: g.rate)
        }
    }

    package func renew() throws -> [(limiter: String, key: String, slots: Int)] { try leases.renew() }
    package func prune() throws { try leases.prune() }
    package func releaseAll() throws { try leases.releaseAll() }
}
