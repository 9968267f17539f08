/// One partition's lease as `opqd.ownership` shows it.
public struct PGPartitionLease: Sendable, Equatable {
    public var partition: Int
    public var instance: String
    public var epoch: Int64
    /// The lease has not run out (by the database's clock).
    public var live: Bool
    public init(partition: Int, instance: String, epoch: Int64, live: Bool) {
        self.partition = partition; self.instance = instance; self.epoch = epoch; self.live = live
    }
}

/// The partitioned form of the ownership lease (`QueuePartitions`): one row per partition,
/// scope `p<n>`, each with its own epoch. The same rules as the one-owner lease: the database's
/// clock decides, a row whose lease ran out may be taken by anyone (epoch + 1), and every
/// commit is fenced by the epochs of the partitions it writes to (`opqd.fence_parts`).
extension PGMembership {
    /// Takes those of `parts` that nobody holds or whose lease ran out: the ones won, with
    /// their new epochs. `token` is this image's secret (as in `tryAcquire`).
    /// The local deadline (`ownsNow`) moves only when `alone` (nothing else is held): otherwise
    /// the partitions held before are good only until their last renewal's deadline, and the
    /// next renewal moves it for all.
    public func claim(_ parts: [Int], token: String, alone: Bool = true) throws -> [Int: Int64] {
        try claimNoting(parts, token: token, alone: alone).won
    }

    /// `claim`, also answering which of the partitions won were taken from an instance that
    /// held them and did not give them up (`release`): it stopped uncleanly or was cut off.
    public func claimNoting(_ parts: [Int], token: String, alone: Bool = true) throws -> (won: [Int: Int64], abandoned: Set<Int>) {
        guard !parts.isEmpty else { return ([:], []) }
        let sent = Self.monotonicNanos()
        let registeredAt = registered.withLock { $0 } ?? "-infinity"
        // Never beside a one-owner cluster's live lease (`--ownership one` on the same
        // database, e.g. during an upgrade): both would run the same queues. The check and the
        // claim are one step for all, under the lock `tryAcquire` takes too.
        let r = try withConnection { c throws(PGFailure) in
            try Self.ownershipStep(c) { c throws(PGFailure) in
                // `prior` reads the rows as they were before the claim (one snapshot for the
                // whole statement): a row that was not given up was abandoned. A row still
                // leased to this instance's id and not renewed since this process registered
                // was left by its previous process (the same identity, `--instance-id` or
                // `--data`): taken back at once, as abandoned. One renewed since has a live twin
                // (an id given to two processes): left alone.
                let r = try c.exec(
                    """
                    WITH prior AS (SELECT scope, released FROM opqd.ownership WHERE scope = ANY($4::text[])), \
                    won AS (INSERT INTO opqd.ownership AS o (scope, instance, epoch, expires_at, token) \
                    SELECT s, $1, 1, now() + make_interval(secs => $2::float8), $3 FROM unnest($4::text[]) AS s \
                    WHERE NOT EXISTS (SELECT 1 FROM opqd.ownership WHERE scope = '*' AND expires_at > now()) \
                    ON CONFLICT (scope) DO UPDATE SET instance = excluded.instance, epoch = o.epoch + 1, expires_at = excluded.expires_at, \
                    token = excluded.token, released = false WHERE o.expires_at < now() \
                    OR (o.instance = $1 AND o.expires_at <= $5::timestamptz + make_interval(secs => $2::float8)) RETURNING scope, epoch) \
                    SELECT won.scope, won.epoch, NOT coalesce(prior.released, true) FROM won LEFT JOIN prior USING (scope)
                    """,
                    [PGParameter(instanceID), PGParameter(String(leaseSeconds)), PGParameter(token), Self.scopes(parts), PGParameter(registeredAt)])
                // The others' forwarders learn the new holder at once (`movesChannel`).
                if r.rows > 0 { try c.exec("SELECT pg_notify('\(Self.movesChannel)', $1)", [PGParameter(instanceID)]) }
                return r
            }
        }
        var won: [Int: Int64] = [:]
        var abandoned = Set<Int>()
        for i in 0..<r.rows {
            guard let scope = r.text(i, 0), let p = QueuePartitions.partition(ofScope: scope), let epoch = r.int64(i, 1) else { continue }
            won[p] = epoch
            if r.bool(i, 2) == true { abandoned.insert(p) }
        }
        if !won.isEmpty && alone { extendDeadline(from: sent) }
        return (won, abandoned)
    }

    /// Renews every partition in `held` (partition → epoch won), also ones whose lease ran out
    /// (while the epoch is unchanged nobody took it). Answers those still held: a partition
    /// missing from the answer was taken by another instance (this one was stopped or cut off
    /// past its lease). The local deadline (`ownsNow`) moves only when all were renewed.
    public func renew(_ held: [Int: Int64]) throws -> Set<Int> {
        guard !held.isEmpty else { return [] }
        let sent = Self.monotonicNanos()
        let parts = held.keys.sorted()
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                UPDATE opqd.ownership o SET expires_at = now() + make_interval(secs => $2::float8) \
                FROM unnest($3::text[], $4::bigint[]) AS h(scope, epoch) \
                WHERE o.scope = h.scope AND o.epoch = h.epoch AND o.instance = $1 RETURNING o.scope
                """,
                [PGParameter(instanceID), PGParameter(String(leaseSeconds)), Self.scopes(parts), Self.epochs(parts.map { held[$0] ?? 0 })])
        }
        var kept = Set<Int>()
        for i in 0..<r.rows {
            if let scope = r.text(i, 0), let p = QueuePartitions.partition(ofScope: scope) { kept.insert(p) }
        }
        if kept.count == held.count { extendDeadline(from: sent) }
        return kept
    }

    /// Gives partitions up at once (a rebalance, a clean stop): the next owner need not wait
    /// for the lease to run out. Only rows still at the epoch this instance won are touched.
    /// Those in `abandoned` (won from an instance that stopped uncleanly, and given back before
    /// their queues were taken in) stay marked as abandoned, so that their next taker still
    /// counts that stop.
    public func release(_ held: [Int: Int64], abandoned: Set<Int> = []) throws {
        guard !held.isEmpty else { return }
        let parts = held.keys.sorted()
        _ = try withConnection { c throws(PGFailure) in
            // The others claim at once, told on `movesChannel` (in the same commit).
            try c.exec(
                """
                WITH r AS (UPDATE opqd.ownership o SET expires_at = now() - interval '1 second', released = NOT (o.scope = ANY($4::text[])) \
                FROM unnest($2::text[], $3::bigint[]) AS h(scope, epoch) \
                WHERE o.scope = h.scope AND o.epoch = h.epoch AND o.instance = $1 RETURNING 1) \
                SELECT pg_notify('\(Self.movesChannel)', $1) WHERE EXISTS (SELECT 1 FROM r)
                """, [PGParameter(instanceID), Self.scopes(parts), Self.epochs(parts.map { held[$0] ?? 0 }), Self.scopes(abandoned.sorted())])
        }
    }

    /// Every partition's lease row, by partition.
    public func partitionLeases() throws -> [PGPartitionLease] {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("SELECT scope, instance, epoch, expires_at > now() FROM opqd.ownership WHERE scope LIKE 'p%'")
        }
        var out: [PGPartitionLease] = []
        for i in 0..<r.rows {
            guard let scope = r.text(i, 0), let p = QueuePartitions.partition(ofScope: scope), let instance = r.text(i, 1),
                let epoch = r.int64(i, 2), let live = r.bool(i, 3)
            else { continue }
            out.append(PGPartitionLease(partition: p, instance: instance, epoch: epoch, live: live))
        }
        return out.sorted { $0.partition < $1.partition }
    }

    /// Block b of operation ids is b << idBlockBits ..< (b + 1) << idBlockBits.
    public static let idBlockBits = PGSchema.idBlockBits

    /// A block of operation ids no other instance is handed (`opqd.id_block`), above every id
    /// stored.
    public func takeIDBlock() throws -> Range<UInt64> {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("BEGIN")
            do throws(PGFailure) {
                try c.exec("SELECT pg_advisory_xact_lock($1::bigint)", [PGParameter(PGSchema.idBlockLock)])
                let r = try c.exec(PGSchema.takeIDBlock)
                try c.exec("COMMIT")
                return r
            } catch {
                _ = try? c.exec("ROLLBACK")
                throw error
            }
        }
        let bits = PGSchema.idBlockBits
        guard let b = r.int64(0, 0), b > 0, UInt64(b) < (1 << (60 - bits)) - 1 else {
            throw PostgresStoreError(.corrupt, url: displayURL, detail: "opqd.id_block is out of range")
        }
        return (UInt64(b) << bits)..<((UInt64(b) + 1) << bits)
    }

    /// The transaction-level advisory lock under which the one-owner lease and partition leases
    /// are taken (`opqd` + 3 in ASCII), so that the two modes never both hold live leases.
    static let ownershipLock: Int64 = 0x6F70_7167

    /// `body` in a transaction holding `ownershipLock`.
    static func ownershipStep(_ c: PGConnection, _ body: (PGConnection) throws(PGFailure) -> PGResult) throws(PGFailure) -> PGResult {
        try c.exec("BEGIN")
        do throws(PGFailure) {
            try c.exec("SELECT pg_advisory_xact_lock($1::bigint)", [PGParameter(ownershipLock)])
            let r = try body(c)
            try c.exec("COMMIT")
            return r
        } catch {
            _ = try? c.exec("ROLLBACK")
            throw error
        }
    }

    static func scopes(_ parts: [Int]) -> PGParameter {
        var a = ArrayColumn()
        for p in parts { a.text(QueuePartitions.scope(p)) }
        return a.parameter
    }

    static func epochs(_ epochs: [Int64]) -> PGParameter {
        var a = ArrayColumn()
        for e in epochs { a.int(e) }
        return a.parameter
    }
}
