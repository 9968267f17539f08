extension QueueEngine {
    /// Forgets finished operations that finished before `cutoff` (at most `limit` per call),
    /// so a long-running server stays bounded. Returns how many were purged. A queue that lost
    /// some has a new revision (its finished count changed), and its row is written.
    @discardableResult
    public func purgeFinished(before cutoff: Timestamp, limit: Int = 10_000) -> Int {
        (try? mutate { core throws(EngineError) in
            var purged = 0
            for q in Array(core.queues.values) {
                guard purged < limit else { break }
                var keep: [OpRecord] = []
                keep.reserveCapacity(q.ops.count)
                for op in q.ops {
                    if purged < limit, op.state == .finished, let f = op.finishedAt, f < cutoff {
                        core.ops[op.id] = nil
                        q.counts[OperationState.finished.index] -= 1
                        purged += 1
                    } else {
                        keep.append(op)
                    }
                }
                if keep.count != q.ops.count {
                    q.ops = keep
                    core.bump(q)
                }
            }
            if purged > 0 { core.ops.compact() }
            return purged
        }) ?? 0
    }
}
