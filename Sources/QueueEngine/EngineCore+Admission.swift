/// API.md "Admission: debounce and singleton", under the engine's lock. A create that names an
/// admission first asks `plan` what it does; a new operation is then made as any other (with
/// the checks and limits of a create), a merge changes the operation that absorbs it, a skip
/// changes nothing. All three are in the same locked section as the decision, so two creates
/// of one key never both see "none yet".
enum AdmissionPlan {
    /// A new operation, depending also on `after` (the started one of a `replaceWaiting` key).
    case create(after: OpRecord?)
    /// `op`, not started, takes the create's spec (and, for a debounce, its options).
    case merge(OpRecord)
    /// Nothing is added: `op` stands for the create.
    case skip(OpRecord)
}

extension EngineCore {
    func admissionIndex(_ q: QueueRecord) -> AdmissionIndex {
        if let a = q.admission { return a }
        let a = AdmissionIndex()
        q.admission = a
        return a
    }

    /// What a create with `admission` does in `q` now.
    func plan(_ admission: Admission, in q: QueueRecord, kind: String) throws(EngineError) -> AdmissionPlan {
        switch admission {
        case let .debounce(key, _, _):
            guard let op = q.admission?.debounce[key], op.state != .finished, !op.hasStarted, op.state != .executing else {
                return .create(after: nil)
            }
            try sameKind(op, kind, key)
            return .merge(op)
        case let .singleton(key, mode):
            let unfinished = (q.admission?.singleton[key] ?? []).filter { $0.state != .finished }
            guard let newest = unfinished.last else { return .create(after: nil) }
            switch mode {
            case .skip:
                return .skip(newest)
            case .replaceWaiting:
                if let waiting = unfinished.first(where: { !$0.hasStarted && $0.state != .executing }) {
                    try sameKind(waiting, kind, key)
                    return .merge(waiting)
                }
                return .create(after: newest)
            }
        }
    }

    private func sameKind(_ op: OpRecord, _ kind: String, _ key: String) throws(EngineError) {
        guard op.kindName == kind else {
            throw .conflict(
                slug: "admission-kind-mismatch",
                detail:
                    "admission key '\(key)' stands for operation \(op.operationID), of kind \(op.kindName); a create of kind \(kind) cannot take its place (use another key)"
            )
        }
    }

    /// The tag a new operation made by `admission` carries, and its first `notBefore`.
    func tag(for admission: Admission) -> AdmissionTag {
        switch admission {
        case let .debounce(key, _, _): AdmissionTag(mode: .debounce, key: key, since: now)
        case let .singleton(key, _): AdmissionTag(mode: .singleton, key: key)
        }
    }

    /// When a debounced operation starts: `seconds` from now, but no later than `maxSeconds`
    /// after the first create it stands for; a later `notBefore` of the create's own wins.
    func debounceStart(_ admission: Admission, since: Timestamp, asked: Timestamp?) -> Timestamp? {
        guard case let .debounce(_, seconds, maxSeconds) = admission else { return asked }
        let wanted = now.nanoseconds.saturatingAdd(Timestamp.clampedNanoseconds(seconds))
        let cap = since.nanoseconds.saturatingAdd(Timestamp.clampedNanoseconds(maxSeconds))
        let start = Timestamp(nanoseconds: max(min(wanted, cap), now.nanoseconds))
        if let asked, asked > start { return asked }
        return start
    }

    /// A new operation made by an admission joins its queue's index.
    func indexAdmitted(_ op: OpRecord, _ tag: AdmissionTag) {
        op.admission = AdmissionTagBox(tag)
        admissionIndex(op.queue).add(op, tag)
    }

    /// `op` (not started) takes the create's `spec` and, for a debounce, its `options` and a
    /// later start. Its limiter keys and host follow the new spec and options; a ready one that
    /// must now wait goes back to pending.
    func absorb(_ op: OpRecord, _ request: OperationRequest, _ admission: Admission) {
        let q = op.queue
        let oldFairness = op.options.fairnessKey
        // A host that stays is kept: detached and attached again, a ready operation would leave
        // its backlog for a moment, and a ramping host whose only held operation it is would
        // close (its ramp over, a breaker event) though the operation is still held.
        let keepHost = op.host.map { op.kind.host(spec: request.spec) == $0.name } ?? false
        if keepHost {
            if !op.limitKeys.isEmpty {
                flowLeft(op, op.state)
                flowEntered(op, .finished)
            }
        } else {
            detachFlow(op)
        }
        op.spec = request.spec
        if case .debounce = admission {
            var options = request.options
            options.notBefore = debounceStart(admission, since: op.admission?.tag.since ?? op.createdAt, asked: request.options.notBefore)
            let earlier = options.notBefore.map { nb in op.options.notBefore.map { nb < $0 } ?? true } ?? true
            op.options = options
            attachFlow(op)
            if !keepHost { attachHost(op) }
            switch op.state {
            case .ready:
                if let nb = options.notBefore, nb > now {
                    applyChecked(.dependencyAdded, to: op)
                    makeReadyIfPossible(op)
                } else {
                    requeue(op, fairness: oldFairness)
                }
            case .pending, .paused:
                // A start moved earlier (the cap, a shorter quiet time) arms its own wake-up; one
                // moved later is found by the wake-up already armed, which arms the next. Paused
                // (it was waiting for its time when paused), the resume arms it: the armed one
                // comes too late.
                if op.waitingForTime && earlier {
                    op.waitingForTime = false
                    makeReadyIfPossible(op)
                }
            case .executing, .finished:
                break
            }
        } else {
            attachFlow(op)
            if !keepHost { attachHost(op) }
            if op.state == .ready { requeue(op, fairness: oldFairness) }
        }
        op.revision += 1
        bump(q)
        record(op)
    }

    /// A ready operation whose limiter keys and host were detached and attached again: one that
    /// was parked (no heap entry) goes back in its queue's ready order, as does one whose
    /// fairness key changed (its old entry, under the old key, is then a duplicate that the
    /// first pop makes stale).
    private func requeue(_ op: OpRecord, fairness old: String?) {
        guard op.heapKey == 0 || op.options.fairnessKey != old else { return }
        op.queue.push(op)
        dirty.append(op.queue)
    }

    /// A finished operation leaves its queue's index.
    func admissionFinished(_ op: OpRecord) {
        guard let tag = op.admission?.tag, let index = op.queue.admission else { return }
        index.remove(op, tag)
    }
}

extension QueueEngine {
    /// An admission a client could send (the API's parser says the same in its own words).
    static func validate(_ admission: Admission) throws(EngineError) {
        switch admission {
        case let .debounce(key, seconds, maxSeconds):
            guard AdmissionTag.isKey(key) else {
                throw .invalidArgument(field: "admission.debounce.key", detail: "must be 1 to \(Admission.maxKeyLength) characters, no control characters")
            }
            guard Admission.secondsRange.contains(seconds) else {
                throw .invalidArgument(field: "admission.debounce.seconds", detail: "must be a number of seconds from 0.001 to 604800; got \(seconds)")
            }
            guard maxSeconds >= seconds, maxSeconds <= Admission.maxSecondsLimit else {
                throw .invalidArgument(
                    field: "admission.debounce.maxSeconds", detail: "must be a number of seconds from seconds (\(seconds)) to 31536000; got \(maxSeconds)")
            }
        case let .singleton(key, _):
            guard AdmissionTag.isKey(key) else {
                throw .invalidArgument(field: "admission.singleton.key", detail: "must be 1 to \(Admission.maxKeyLength) characters, no control characters")
            }
        }
    }
}

/// The operation an element of a batch meets under its key: one that exists, or an earlier
/// element's (made in the same batch).
enum Standing {
    case existing(OpRecord)
    case element(Int)

    func resolve(_ made: [OpRecord]) -> OpRecord {
        switch self {
        case let .existing(op): op
        case let .element(i): made[i]
        }
    }
}

/// `AdmissionPlan` for an element of a batch.
enum BatchAdmission {
    case create(after: Standing?)
    case merge(Standing)
    case skip(Standing)
}

extension EngineCore {
    /// Each element's admission, in order, as if the elements before it were already in: an
    /// element may merge into, or be skipped for, an earlier one. Nothing changes here.
    func planBatch(_ elements: [BatchElement], queues: [QueueRecord]) -> Result<[BatchAdmission?], BatchRefusal> {
        var plans: [BatchAdmission?] = []
        plans.reserveCapacity(elements.count)
        // Per queue and key, what the batch made so far: the debounced one not started, the
        // singleton's unfinished ones (oldest first; new ones have not started).
        var debounced: [ObjectIdentifier: [String: Standing]] = [:]
        var singles: [ObjectIdentifier: [String: [Standing]]] = [:]
        func kindName(_ s: Standing) -> String {
            switch s {
            case let .existing(op): op.kindName
            case let .element(j): elements[j].request.kind
            }
        }
        func notStarted(_ s: Standing) -> Bool {
            switch s {
            case let .existing(op): !op.hasStarted && op.state != .executing && op.state != .finished
            case .element: true
            }
        }
        for (i, e) in elements.enumerated() {
            guard let admission = e.request.admission else { plans.append(nil); continue }
            let q = queues[i]
            let qid = ObjectIdentifier(q)
            let mismatch = { (s: Standing) -> BatchRefusal? in
                let k = kindName(s)
                guard k != e.request.kind else { return nil }
                return BatchRefusal(
                    index: i,
                    error: .conflict(
                        slug: "admission-kind-mismatch",
                        detail:
                            "admission key '\(admission.key)' stands for an operation of kind \(k); a create of kind \(e.request.kind) cannot take its place (use another key)"
                    ))
            }
            switch admission {
            case let .debounce(key, _, _):
                var standing = debounced[qid]?[key]
                if standing == nil, let op = q.admission?.debounce[key], notStarted(.existing(op)) { standing = .existing(op) }
                if let s = standing {
                    if let refusal = mismatch(s) { return .failure(refusal) }
                    plans.append(.merge(s))
                } else {
                    plans.append(.create(after: nil))
                    debounced[qid, default: [:]][key] = .element(i)
                }
            case let .singleton(key, mode):
                var list = singles[qid]?[key] ?? (q.admission?.singleton[key] ?? []).filter { $0.state != .finished }.map { Standing.existing($0) }
                guard let newest = list.last else {
                    plans.append(.create(after: nil))
                    singles[qid, default: [:]][key] = [.element(i)]
                    continue
                }
                switch mode {
                case .skip:
                    plans.append(.skip(newest))
                case .replaceWaiting:
                    if let waiting = list.first(where: notStarted) {
                        if let refusal = mismatch(waiting) { return .failure(refusal) }
                        plans.append(.merge(waiting))
                    } else {
                        plans.append(.create(after: newest))
                        list.append(.element(i))
                    }
                }
                singles[qid, default: [:]][key] = list
            }
        }
        return .success(plans)
    }
}
