import QueueEngine

/// What the instance deciding a batch across instances commits (`PostgresStore.decideBatch`).
package struct BatchDecision: Sendable {
    /// The batch's id: random, unique.
    package var id: String
    /// The Idempotency-Key's scope it was made under, and the hash of its body.
    package var idem: String?
    package var bodyHash: [UInt8]?
    /// The request's body as received (each owner reads its part from it).
    package var body: [UInt8]
    /// The id each owner set aside for each element, in the batch's order.
    package var ids: [OperationID]
    /// Each partition with elements, and their ids.
    package var parts: [(part: Int, ids: [OperationID])]
    /// Each owner's partitions (`p<n>`) at the epochs it held when it set its part aside.
    package var fences: [(instance: String, scopes: [String], epochs: [Int64])]

    package init(
        id: String, idem: String?, bodyHash: [UInt8]?, body: [UInt8], ids: [OperationID], parts: [(part: Int, ids: [OperationID])],
        fences: [(instance: String, scopes: [String], epochs: [Int64])]
    ) {
        self.id = id; self.idem = idem; self.bodyHash = bodyHash; self.body = body; self.ids = ids; self.parts = parts; self.fences = fences
    }
}

/// How a decision ended.
package enum BatchDecisionOutcome: Sendable, Equatable {
    /// The batch is committed: its owners add their parts (or whoever takes their partitions).
    case committed
    /// An owner stopped waiting and wrote the batch off first: nothing is committed.
    case aborted
    /// An owner no longer holds a partition of its part at the epoch it prepared under.
    case fenced
    /// A batch with the same Idempotency-Key was committed before: this one is not.
    case sameKey(id: String)
}

/// A committed batch, as an owner reads it to add its part.
package struct CommittedBatch: Sendable {
    package var body: [UInt8]
    package var ids: [OperationID]
}

extension PostgresStore {
    /// Commits batch `d` in one transaction: fenced by every owner's partitions (share-locked:
    /// a takeover waits for this commit), the batch's row with outcome 'commit' unless an owner
    /// wrote it off first ('abort' wins the row), and its parts' rows. A repeat of the same
    /// decision (a lost answer) finds its own row and answers `committed`.
    package func decideBatch(_ d: BatchDecision) throws(PostgresStoreError) -> BatchDecisionOutcome {
        var ids = ArrayColumn()
        for id in d.ids { ids.counter(id.raw) }
        let url = displayURL
        return try batchConnection.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) {
                let outcome = try r.withConnection { c throws(PGFailure) -> BatchDecisionOutcome in
                    try c.exec("BEGIN")
                    do throws(PGFailure) {
                        // The fence share-locks other instances' ownership rows: a session left
                        // in its transaction (this process paused, its link cut) must not hold
                        // them past a lease (their renewals and any takeover wait for it).
                        try c.exec("SET LOCAL idle_in_transaction_session_timeout = '5s'")
                        try c.exec("SET LOCAL lock_timeout = '5s'")
                        try c.exec("SET LOCAL tcp_keepalives_idle = 5")
                        try c.exec("SET LOCAL tcp_keepalives_interval = 2")
                        try c.exec("SET LOCAL tcp_keepalives_count = 3")
                        // Tried again after a lost connection: its COMMIT may have landed.
                        let before = try c.exec("SELECT outcome FROM opqd.batches WHERE id = $1", [PGParameter(d.id)])
                        if before.rows == 1 {
                            try c.exec("ROLLBACK")
                            return before.text(0, 0) == "commit" ? .committed : .aborted
                        }
                        for f in d.fences {
                            var scopes = ArrayColumn()
                            for s in f.scopes { scopes.text(s) }
                            var epochs = ArrayColumn()
                            for e in f.epochs { epochs.int(e) }
                            do throws(PGFailure) {
                                try c.exec(PGSchema.fenceParts, [PGParameter(f.instance), scopes.parameter, epochs.parameter])
                            } catch  where error.sqlState == PGSchema.fencedState {
                                _ = try? c.exec("ROLLBACK")
                                return .fenced
                            }
                        }
                        if let idem = d.idem {
                            let same = try c.exec("SELECT id FROM opqd.batches WHERE idem = $1 AND id <> $2", [PGParameter(idem), PGParameter(d.id)])
                            if same.rows > 0, let other = same.text(0, 0) {
                                try c.exec("ROLLBACK")
                                return .sameKey(id: other)
                            }
                        }
                        do throws(PGFailure) {
                            try c.exec(
                                """
                                INSERT INTO opqd.batches (id, outcome, idem, body_hash, body, ids) VALUES ($1, 'commit', $2, $3, $4, $5::bigint[]) \
                                ON CONFLICT (id) DO NOTHING
                                """,
                                [
                                    PGParameter(d.id), d.idem.map { PGParameter($0) } ?? .null, d.bodyHash.map { PGParameter(bytea: $0) } ?? .null,
                                    PGParameter(bytea: d.body), ids.parameter,
                                ])
                        } catch  where error.sqlState == "23505" {
                            // The same key committed by another decision that was under way.
                            try c.exec("ROLLBACK")
                            let same = try c.exec("SELECT id FROM opqd.batches WHERE idem = $1", [PGParameter(d.idem ?? "")])
                            guard same.rows == 1, let other = same.text(0, 0) else { throw error }
                            return .sameKey(id: other)
                        }
                        let outcome = try c.exec("SELECT outcome FROM opqd.batches WHERE id = $1", [PGParameter(d.id)])
                        guard outcome.rows == 1, outcome.text(0, 0) == "commit" else {
                            try c.exec("ROLLBACK")
                            return .aborted
                        }
                        for part in d.parts {
                            var partIDs = ArrayColumn()
                            for id in part.ids { partIDs.counter(id.raw) }
                            try c.exec(
                                "INSERT INTO opqd.batch_parts (batch, part, ids) VALUES ($1, $2, $3::bigint[]) ON CONFLICT DO NOTHING",
                                [PGParameter(d.id), PGParameter(part.part), partIDs.parameter])
                        }
                        try c.exec("COMMIT")
                        return .committed
                    } catch {
                        _ = try? c.exec("ROLLBACK")
                        throw error
                    }
                }
                // Batches decided more than a day ago whose parts are all added (or that were
                // written off) go, a few at a time.
                _ = try? r.withConnection { c throws(PGFailure) in try c.exec(PGSchema.pruneBatches) }
                return outcome
            } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// An owner that waited too long for batch `id`'s decision writes it off unless it is
    /// committed already: true when it is committed (add the part), false when it is not and
    /// never will be.
    package func writeOffBatch(_ id: String) throws(PostgresStoreError) -> Bool {
        try onBatchConnection { c throws(PGFailure) in
            try c.exec("INSERT INTO opqd.batches (id, outcome) VALUES ($1, 'abort') ON CONFLICT (id) DO NOTHING", [PGParameter(id)])
            let r = try c.exec("SELECT outcome FROM opqd.batches WHERE id = $1", [PGParameter(id)])
            return r.rows == 1 && r.text(0, 0) == "commit"
        }
    }

    /// Batch `id` if it is committed; nil when it is not (undecided, written off, or unknown).
    package func committedBatch(_ id: String) throws(PostgresStoreError) -> CommittedBatch? {
        try onBatchConnection { c throws(PGFailure) -> CommittedBatch? in
            let r = try c.exec("SELECT body, ids FROM opqd.batches WHERE id = $1 AND outcome = 'commit'", [PGParameter(id)])
            guard r.rows == 1, let body = r.bytea(0, 0), let text = r.text(0, 1) else { return nil }
            return CommittedBatch(body: body, ids: Self.ids(fromArray: text))
        }
    }

    /// The committed batch made under Idempotency-Key scope `idem`: its id and body hash.
    package func batch(withKey idem: String) throws(PostgresStoreError) -> (id: String, bodyHash: [UInt8])? {
        try onBatchConnection { c throws(PGFailure) -> (id: String, bodyHash: [UInt8])? in
            let r = try c.exec("SELECT id, body_hash FROM opqd.batches WHERE idem = $1 AND outcome = 'commit'", [PGParameter(idem)])
            guard r.rows == 1, let id = r.text(0, 0) else { return nil }
            return (id, r.bytea(0, 1) ?? [])
        }
    }

    /// Committed batches with a part in one of `parts` that is not added yet (oldest first).
    package func pendingBatches(parts: [Int]) throws(PostgresStoreError) -> [String] {
        guard !parts.isEmpty else { return [] }
        var list = ArrayColumn()
        for p in parts { list.int(p) }
        return try onBatchConnection { c throws(PGFailure) -> [String] in
            let r = try c.exec(
                """
                SELECT p.batch FROM opqd.batch_parts p JOIN opqd.batches b ON b.id = p.batch \
                WHERE p.part = ANY($1::integer[]) GROUP BY p.batch ORDER BY min(b.decided_at)
                """, [list.parameter])
            return (0..<r.rows).compactMap { r.text($0, 0) }
        }
    }

    /// The partitions of batch `id` whose parts are not added yet.
    package func pendingParts(of id: String) throws(PostgresStoreError) -> [Int] {
        try onBatchConnection { c throws(PGFailure) -> [Int] in
            let r = try c.exec("SELECT part FROM opqd.batch_parts WHERE batch = $1", [PGParameter(id)])
            return (0..<r.rows).compactMap { r.int64($0, 0).flatMap { Int(exactly: $0) } }
        }
    }

    private func onBatchConnection<T>(_ body: (PGConnection) throws(PGFailure) -> T) throws(PostgresStoreError) -> T {
        let url = displayURL
        return try batchConnection.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) {
                return try r.withConnection(body)
            } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// `{1,2,3}` (a bigint[] as text) as ids; elements that are not ids are left out.
    static func ids(fromArray text: String) -> [OperationID] {
        text.dropFirst().dropLast().split(separator: ",").compactMap { UInt64($0).map { OperationID(raw: $0) } }
    }
}
