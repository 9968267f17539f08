import Locking
import QueueEngine

/// What an instance asks of one key of a limiter in an exchange (`PGLimiterLeases.exchange`).
package struct LeaseRequest: Sendable, Equatable {
    package var limiter: String
    package var key: String
    /// Slots the instance goes on holding (operations it runs with this limiter and key).
    package var keepSlots: Int
    /// Slots it would like on top of `keepSlots` (operations ready to start).
    package var wantSlots: Int
    /// Tokens it would like from the key's bucket (starts it means to make soon).
    package var wantTokens: Int

    package init(limiter: String, key: String, keepSlots: Int = 0, wantSlots: Int = 0, wantTokens: Int = 0) {
        self.limiter = limiter
        self.key = key
        self.keepSlots = keepSlots
        self.wantSlots = wantSlots
        self.wantTokens = wantTokens
    }
}

/// What an exchange gave one key: the slots this instance now holds and the tokens it took,
/// with the key's budget as the database read it.
package struct LeaseGrant: Sendable, Equatable {
    package var limiter: String
    package var key: String
    /// Slots this instance holds for the key after the exchange, until its lease runs out:
    /// `keepSlots + wantSlots` at most, and never more than the budget leaves beside the other
    /// instances' live slots, so possibly fewer than `keepSlots` (start nothing more until the
    /// running count is below it). `unlimited` when the budget has no concurrency.
    package var slots: Int
    /// Tokens taken from the key's bucket for this instance (each allows one start), at most
    /// `wantTokens`; `wantTokens` when the budget has no rate.
    package var tokens: Int
    /// The key's budget (an override's fields replace the limiter's): nil for none.
    package var concurrency: Int?
    package var rate: RateLimit?
    /// Tokens left in the key's shared bucket after the exchange; nil without a rate.
    package var bucket: Double?
    /// Why nothing was granted: the limiter is gone, or its row cannot be read. Nil when the
    /// budget was read.
    package var refusal: LeaseRefusal?

    package init(
        limiter: String, key: String, slots: Int, tokens: Int, concurrency: Int? = nil, rate: RateLimit? = nil, bucket: Double? = nil,
        refusal: LeaseRefusal? = nil
    ) {
        self.limiter = limiter
        self.key = key
        self.slots = slots
        self.tokens = tokens
        self.concurrency = concurrency
        self.rate = rate
        self.bucket = bucket
        self.refusal = refusal
    }

    /// `slots` for a budget without concurrency.
    package static let unlimited = 1_000_000_000
}

/// Why an exchange granted a key nothing (0 slots, 0 tokens, and this instance's slots given
/// back) whatever it asked.
package enum LeaseRefusal: Sendable, Equatable {
    /// No limiter of that name (deleted).
    case noSuchLimiter
    /// The limiter's row holds a value opqd could not have written (`limiters row "l": ` and
    /// the reason, e.g. `column overrides is not a JSON object`). Nothing is granted rather
    /// than a budget guessed.
    case damaged(String)
}

/// An exchange, renewal or release that did not happen, or whose answer cannot be read.
package struct PGLeaseError: Error, Sendable, CustomStringConvertible {
    package enum Reason: Sendable, Equatable {
        /// PostgreSQL could not be reached, or refused the statement: try again later. What
        /// this instance held stays held until its lease runs out.
        case unavailable
        /// The answer is not one the functions of schema 11 give (a database edited by hand).
        case damaged
        /// The caller asked for one key twice in one exchange.
        case invalidRequest
    }

    package let reason: Reason
    package let description: String
}

/// An instance's leases of limiter budgets in PostgreSQL (API.md "Flow control": a limiter's
/// budget is one budget for the whole cluster), on a connection of its own.
///
/// The budget lives in the database (schema 11: `opqd.limiter_buckets`, `opqd.limiter_slots`);
/// each instance holds some slots and tokens of a key and starts operations within them. An
/// exchange (`opqd.limiter_exchange`, once per key, keys in one statement and so one
/// transaction) reads the key's budget from `opqd.limiters` (`opqd.read_limiter`, once per
/// limiter, and `opqd.limiter_budget`), locks the key's bucket row, gives
/// this instance `min(keep + want, concurrency − the other instances' live slots)` slots until
/// now + the lease, and takes up to `wantTokens` whole tokens from the refilled bucket. Time is
/// the database's clock, so instances with skewed clocks agree.
///
/// Slots are held until the lease runs out unless renewed (`renew`, one statement for every key
/// of this instance): the rows of a crashed instance stop counting then, and the next exchange
/// of that key deletes them. The caller's own deadline for a key is the moment it *sent* the
/// exchange or renewal that last extended it, plus the lease (the database's `expires_at` is
/// later): past it, the slots may be someone else's.
///
/// Deadlocks: keys are exchanged in one order (limiter, then key, bytewise), and a renewal or
/// release locks this instance's rows in that same order, so transactions that share keys wait
/// for each other but never in a cycle.
package final class PGLimiterLeases: Sendable {
    package let instance: String
    package let leaseSeconds: Double
    /// Whether an exchange's commit waits for its WAL to be flushed (`synchronous_commit`).
    package let durableCommits: Bool
    /// The reader, and the connection (`PGReader.connections`) `synchronous_commit` was last set on.
    private let session: Lock<(reader: PGReader, configured: Int)>

    /// No connection yet: the first call connects (bounded: a statement runs at most 2 s), and a
    /// lost connection is replaced on the next call. The schema is the store's to migrate
    /// (`PostgresStore` opens first).
    ///
    /// `durableCommits` false: exchanges commit without waiting for the disk
    /// (`synchronous_commit off`), which takes the WAL flush out of every exchange (measured on
    /// this machine's idle disk: 0.33 → 0.22 ms for one key; a contended disk made the flush
    /// alone 4 ms at times, `opqd-bench limiter-leases`). The price: when PostgreSQL itself crashes, the exchanges of its last
    /// moments (up to 3 × `wal_writer_delay`, 600 ms by default) are forgotten, so slots and
    /// tokens handed out then may be handed out again once: the budget can be exceeded once,
    /// briefly, after a crash of the database (never of an instance).
    package init(url: String, instance: String, leaseSeconds: Double, durableCommits: Bool = true) {
        self.instance = instance
        self.leaseSeconds = leaseSeconds
        self.durableCommits = durableCommits
        session = Lock((PGReader(url: url, connection: nil, bounded: true), 0))
    }

    deinit { close() }

    package func close() {
        session.withLock { $0.reader.close() }
    }

    private var leaseNanos: Int64 {
        guard leaseSeconds.isFinite, leaseSeconds > 0 else { return 0 }
        return Int64(min(leaseSeconds, 86_400) * 1e9)
    }

    private func run<T>(_ what: String, _ body: (PGConnection) throws(PGFailure) -> T) throws(PGLeaseError) -> T {
        do {
            return try session.withLock { s throws(PGFailure) in
                let reader = s.reader
                var configured = s.configured
                defer { s.configured = configured }
                return try reader.withConnection { c throws(PGFailure) in
                    // Once per connection (a new one after a lost one starts with the default).
                    if !durableCommits, configured != reader.connections {
                        try c.exec("SET synchronous_commit TO off")
                        configured = reader.connections
                    }
                    return try body(c)
                }
            }
        } catch {
            throw PGLeaseError(reason: .unavailable, description: "\(what) failed: \(error.description)")
        }
    }

    /// Every key's exchange in one transaction, one round trip; the grants in the order of
    /// `requests`. Counts are taken from 0 to 1,000,000,000. An error changes nothing.
    package func exchange(_ requests: [LeaseRequest]) throws(PGLeaseError) -> [LeaseGrant] {
        if requests.isEmpty { return [] }
        // The lock order every instance shares (`ORDER BY limiter COLLATE "C", key` in SQL).
        let order = requests.indices.sorted { a, b in
            let x = requests[a], y = requests[b]
            if x.limiter != y.limiter { return x.limiter.utf8.lexicographicallyPrecedes(y.limiter.utf8) }
            return x.key.utf8.lexicographicallyPrecedes(y.key.utf8)
        }
        var columns = [ArrayColumn](repeating: ArrayColumn(), count: 5)
        var previous: LeaseRequest?
        for i in order {
            let r = requests[i]
            if let p = previous, p.limiter == r.limiter, p.key == r.key {
                throw PGLeaseError(reason: .invalidRequest, description: "limiter \(r.limiter) key \(r.key.debugDescription) asked for twice in one exchange")
            }
            previous = r
            columns[0].text(r.limiter)
            columns[1].bytea(r.key.utf8)
            columns[2].int(Self.count(r.keepSlots))
            columns[3].int(Self.count(r.wantSlots))
            columns[4].int(Self.count(r.wantTokens))
        }
        let parameters = [PGParameter(instance)] + columns.map(\.parameter) + [PGParameter(leaseNanos)]
        let result = try run("exchanging limiter leases") { c throws(PGFailure) in
            try c.execPrepared("opqd_limiter_exchange", Self.exchangeStatement, parameters)
        }
        guard result.rows == requests.count else {
            throw PGLeaseError(reason: .damaged, description: "opqd.limiter_exchange answered \(result.rows) rows for \(requests.count) keys")
        }
        var grants = [LeaseGrant?](repeating: nil, count: requests.count)
        for row in 0..<result.rows {
            guard let n = result.int64(row, 0), n >= 1, n <= order.count else {
                throw PGLeaseError(reason: .damaged, description: "opqd.limiter_exchange answered row number \(result.text(row, 0) ?? "NULL")")
            }
            let i = order[Int(n) - 1]
            grants[i] = try Self.grant(result, row, for: requests[i])
        }
        return grants.compactMap { $0 }
    }

    /// 0 ... 1,000,000,000: what the SQL computes with stays far from overflowing.
    private static func count(_ n: Int) -> Int { min(max(n, 0), LeaseGrant.unlimited) }

    /// `limiter_exchange` for every row of the arrays, in their order (the lock order), as one
    /// statement: one transaction, parsed and planned once per connection. Each limiter's row is
    /// read once (`s`: its overrides' JSON parsed once however many of its keys are asked), and
    /// handed to each of its keys by a subquery, which leaves the rows' order to `unnest` alone.
    static let exchangeStatement = """
        WITH s AS MATERIALIZED (SELECT d.lim, opqd.read_limiter(d.lim) AS s FROM (SELECT DISTINCT unnest($2::text[]) AS lim) d) \
        SELECT r.n, g.g_slots, g.g_tokens, g.g_concurrency, g.g_per_second, g.g_burst, g.g_bucket, g.g_state, g.g_detail \
        FROM unnest($2::text[], $3::bytea[], $4::bigint[], $5::bigint[], $6::bigint[]) WITH ORDINALITY AS r(lim, k, keep, want, want_tokens, n) \
        CROSS JOIN LATERAL opqd.limiter_exchange($1, r.lim, r.k, r.keep, r.want, r.want_tokens, $7::bigint, \
        (SELECT s.s FROM s WHERE s.lim = r.lim)) AS g ORDER BY r.n
        """

    /// One row of `exchangeStatement`, checked against what the function can answer.
    private static func grant(_ r: PGResult, _ row: Int, for q: LeaseRequest) throws(PGLeaseError) -> LeaseGrant {
        func damaged(_ why: String) -> PGLeaseError {
            PGLeaseError(reason: .damaged, description: "opqd.limiter_exchange for limiter \(q.limiter) key \(q.key.debugDescription): \(why)")
        }
        var g = LeaseGrant(limiter: q.limiter, key: q.key, slots: 0, tokens: 0)
        switch r.text(row, 7) {
        case "ok":
            break
        case "missing":
            g.refusal = .noSuchLimiter
            return g
        case "damaged":
            g.refusal = .damaged("limiters row \"\(q.limiter)\": \(r.text(row, 8) ?? "unreadable")")
            return g
        case let other:
            throw damaged("state \(other ?? "NULL")")
        }
        guard let slots = r.int64(row, 1), let s = Int(exactly: slots), (0...LeaseGrant.unlimited).contains(s) else {
            throw damaged("slots \(r.text(row, 1) ?? "NULL")")
        }
        guard let tokens = r.int64(row, 2), let t = Int(exactly: tokens), (0...count(q.wantTokens)).contains(t) else {
            throw damaged("tokens \(r.text(row, 2) ?? "NULL")")
        }
        g.slots = s
        g.tokens = t
        if !r.isNull(row, 3) {
            guard let c = r.int64(row, 3), let n = Int(exactly: c), LimiterBudget.concurrencyRange.contains(n), s <= n else {
                throw damaged("concurrency \(r.text(row, 3) ?? "NULL") with \(s) slots")
            }
            g.concurrency = n
        }
        switch (r.double(row, 4), r.int64(row, 5)) {
        case (nil, nil) where r.isNull(row, 4) && r.isNull(row, 5):
            break
        case let (p?, b?):
            guard p.isFinite, RateLimit.perSecondRange.contains(p), let burst = Int(exactly: b), RateLimit.burstRange.contains(burst) else {
                throw damaged("rate \(p)/s burst \(b)")
            }
            g.rate = RateLimit(perSecond: p, burst: burst)
            guard let left = r.double(row, 6), left.isFinite, left >= 0, left <= Double(burst) else {
                throw damaged("bucket \(r.text(row, 6) ?? "NULL")")
            }
            g.bucket = left
        default:
            throw damaged("rate \(r.text(row, 4) ?? "NULL")/s burst \(r.text(row, 5) ?? "NULL")")
        }
        return g
    }

    /// Extends every live slot row of this instance to now + the lease (one statement), and
    /// deletes those whose lease ran out. Answers the keys this instance still holds slots of,
    /// with their slots, sorted as exchanges lock them: any other key it believed it held is
    /// lost (its lease ran out, or another instance's exchange found it expired and deleted
    /// it), and the caller starts nothing more on it before its next exchange of that key.
    @discardableResult
    package func renew() throws(PGLeaseError) -> [(limiter: String, key: String, slots: Int)] {
        let r = try run("renewing limiter leases") { c throws(PGFailure) in
            try c.execPrepared("opqd_limiter_renew", Self.renewStatement, [PGParameter(instance), PGParameter(leaseNanos)])
        }
        var held: [(limiter: String, key: String, slots: Int)] = []
        held.reserveCapacity(r.rows)
        for row in 0..<r.rows {
            guard let limiter = r.text(row, 0), let key = Self.key(r, row, 1) else {
                throw PGLeaseError(reason: .damaged, description: "opqd.limiter_slots has a row of instance \(instance) whose key is not UTF-8")
            }
            guard let n = r.int64(row, 2), let slots = Int(exactly: n), slots > 0 else {
                throw PGLeaseError(
                    reason: .damaged,
                    description:
                        "opqd.limiter_slots holds \(r.text(row, 2) ?? "NULL") slots of instance \(instance) for limiter \(limiter) key \(key.debugDescription)")
            }
            held.append((limiter, key, slots))
        }
        return held
    }

    /// Rows are locked in the exchange's order before they change (no cycle with an exchange
    /// that holds some of them). A row another instance's exchange deleted meanwhile (it had
    /// expired) is skipped once that exchange commits: not renewed, not answered.
    static let renewStatement = """
        WITH t AS (SELECT opqd.clock_ns() AS now), \
        locked AS (SELECT s.limiter, s.key, s.expires_at > t.now AS live FROM opqd.limiter_slots s, t WHERE s.instance = $1 \
        ORDER BY s.limiter COLLATE "C", s.key FOR UPDATE OF s), \
        u AS (UPDATE opqd.limiter_slots s SET expires_at = t.now + $2::bigint FROM locked, t \
        WHERE s.instance = $1 AND s.limiter = locked.limiter AND s.key = locked.key AND locked.live RETURNING s.limiter, s.key, s.slots), \
        d AS (DELETE FROM opqd.limiter_slots s USING locked \
        WHERE s.instance = $1 AND s.limiter = locked.limiter AND s.key = locked.key AND NOT locked.live) \
        SELECT u.limiter, u.key, u.slots FROM u ORDER BY u.limiter COLLATE "C", u.key
        """

    /// Deletes every slot row of this instance (a clean stop: the others may use them at once).
    package func releaseAll() throws(PGLeaseError) {
        _ = try run("releasing limiter leases") { c throws(PGFailure) in
            try c.exec(
                """
                WITH l AS (SELECT s.limiter, s.key FROM opqd.limiter_slots s WHERE s.instance = $1 \
                ORDER BY s.limiter COLLATE "C", s.key FOR UPDATE) \
                DELETE FROM opqd.limiter_slots s USING l WHERE s.instance = $1 AND s.limiter = l.limiter AND s.key = l.key
                """, [PGParameter(instance)])
        }
    }

    /// The live slots of every instance per key of `limiter`, summed, sorted by key (bytewise):
    /// what the cluster holds, for display. Keys without concurrency hold none.
    package func held(limiter: String) throws(PGLeaseError) -> [(key: String, slots: Int)] {
        let r = try run("reading limiter leases") { c throws(PGFailure) in
            try c.execPrepared(
                "opqd_limiter_held",
                """
                SELECT s.key, sum(s.slots) FROM opqd.limiter_slots s WHERE s.limiter = $1 AND s.expires_at > (SELECT opqd.clock_ns()) \
                GROUP BY s.key ORDER BY s.key
                """, [PGParameter(limiter)])
        }
        var out: [(key: String, slots: Int)] = []
        out.reserveCapacity(r.rows)
        for row in 0..<r.rows {
            guard let key = Self.key(r, row, 0) else {
                throw PGLeaseError(reason: .damaged, description: "opqd.limiter_slots has a row of limiter \(limiter) whose key is not UTF-8")
            }
            guard let n = r.int64(row, 1), let slots = Int(exactly: n), slots >= 0 else {
                throw PGLeaseError(
                    reason: .damaged,
                    description: "opqd.limiter_slots holds \(r.text(row, 1) ?? "NULL") slots of limiter \(limiter) key \(key.debugDescription)")
            }
            out.append((key, slots))
        }
        return out
    }

    /// Forgets what no longer matters, at most `limit` rows of each kind: slot rows whose lease
    /// ran out (a crashed instance's, of keys nobody exchanges any more), and bucket rows of
    /// keys nobody holds slots of whose bucket is full by now (or has no rate, or whose limiter
    /// is gone): a bucket made again later starts full, which is what it would hold. Rows
    /// locked by an exchange are skipped (never waited for). Any instance may call it now and
    /// then; answers the counts deleted.
    @discardableResult
    package func prune(limit: Int = 1000) throws(PGLeaseError) -> (slots: Int, buckets: Int) {
        let r = try run("pruning limiter leases") { c throws(PGFailure) in
            try c.execPrepared("opqd_limiter_prune", Self.pruneStatement, [PGParameter(max(1, limit))])
        }
        guard let s = r.int64(0, 0), let b = r.int64(0, 1), let slots = Int(exactly: s), let buckets = Int(exactly: b) else {
            throw PGLeaseError(reason: .damaged, description: "pruning limiter leases answered \(r.text(0, 0) ?? "NULL"), \(r.text(0, 1) ?? "NULL")")
        }
        return (slots, buckets)
    }

    static let pruneStatement = """
        WITH t AS (SELECT opqd.clock_ns() AS now), \
        dead AS (DELETE FROM opqd.limiter_slots s WHERE (s.limiter, s.key, s.instance) IN (\
        SELECT x.limiter, x.key, x.instance FROM opqd.limiter_slots x, t WHERE x.expires_at <= t.now \
        LIMIT $1::bigint FOR UPDATE OF x SKIP LOCKED) RETURNING 1), \
        idle AS (DELETE FROM opqd.limiter_buckets b WHERE (b.limiter, b.key) IN (\
        SELECT y.limiter, y.key FROM opqd.limiter_buckets y, t \
        WHERE NOT EXISTS (SELECT 1 FROM opqd.limiter_slots z WHERE z.limiter = y.limiter AND z.key = y.key) \
        AND (y.rate_per_second IS NULL OR NOT EXISTS (SELECT 1 FROM opqd.limiters l WHERE l.name = y.limiter) \
        OR y.tokens + greatest(0, t.now::float8 - y.refilled_at::float8) / 1e9 * y.rate_per_second >= y.rate_burst) \
        LIMIT $1::bigint FOR UPDATE OF y SKIP LOCKED) RETURNING 1) \
        SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM idle)
        """

    /// A key column (`bytea`, the client's string): nil when it is not UTF-8.
    private static func key(_ r: PGResult, _ row: Int, _ column: Int) -> String? {
        guard let bytes = r.bytea(row, column) else { return nil }
        return String(validating: bytes, as: UTF8.self)
    }
}
