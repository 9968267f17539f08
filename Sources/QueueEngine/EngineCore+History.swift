/// Recording a queue's history (`History.swift`) as its operations move, under the engine's
/// lock: a create, each attempt's start, the wait from ready to executing, and the end with
/// its outcome and run time. Changed buckets go to the store on a timer (`historyFlushSeconds`)
/// with whatever else is committed then: no commit of their own per operation.
extension EngineCore {
    /// Seconds between writes of changed buckets: what a kill -9 may lose at most (plus the
    /// commit in flight).
    static let historyFlushSeconds = 2.0

    func history(_ q: QueueRecord) -> QueueHistory {
        if let h = q.history { return h }
        let h = QueueHistory()
        q.history = h
        return h
    }

    /// Changes the buckets of now in `q`'s rings and arms the flush.
    @inline(__always)
    func noteHistory(_ q: QueueRecord, _ body: (inout HistoryBucket) -> Void) {
        let h = history(q)
        let wasClean = !h.needsFlush
        let t = now.nanoseconds / 1_000_000_000
        h.change(at: t, body)
        historyTotal.change(at: t, body)
        if wasClean { historyDirty.append(q) }
        if !historyFlushArmed {
            historyFlushArmed = true
            effects.append(.flowWake(.history, seconds: Self.historyFlushSeconds))
        }
    }

    /// The timer: every changed bucket becomes a record of this section.
    func flushHistory() {
        historyFlushArmed = false
        let queues = historyDirty
        historyDirty.removeAll(keepingCapacity: true)
        for q in queues { recordHistory(of: q) }
    }

    /// The changed buckets of queues leaving this engine (given up to another instance), now:
    /// their history follows them in the last commit made for them here.
    func flushHistory(of names: Set<String>) {
        for q in historyDirty where names.contains(q.name) { recordHistory(of: q) }
    }

    /// `q`'s changed buckets as records of this section.
    private func recordHistory(of q: QueueRecord) {
        guard !q.deleted, let rows = q.history?.takeDirty(queue: q.name) else { return }
        for row in rows {
            ticket &+= 1
            if wantsRecords { outRecords.append(.history(row)) }
        }
    }

    /// `q` leaves this engine (deleted, or given to another instance): its buckets leave the sum.
    func historyLeaves(_ q: QueueRecord) {
        if let h = q.history { historyTotal.merge(h, negative: true) }
    }

    func historyFinished(_ op: OpRecord) {
        let run = op.startedAt.map { now.nanoseconds.saturatingSubtract($0.nanoseconds) }
        let outcome = op.outcome
        noteHistory(op.queue) { b in
            switch outcome {
            case .succeeded?: b.succeeded &+= 1
            case .failed?: b.failed &+= 1
            case .cancelled?, nil: b.cancelled &+= 1
            }
            if let run { b.run.add(nanoseconds: run) }
        }
    }
}
