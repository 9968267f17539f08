import QueueEngine

/// Hand-written JSON for the API's resources: the status GET is the hottest path, and
/// building bytes directly is several times cheaper than Codable on Linux.
struct JSONOut {
    var bytes: [UInt8] = []
    private var needsComma = false

    init(capacity: Int = 512) { bytes.reserveCapacity(capacity) }

    mutating func open() { comma(); bytes.append(UInt8(ascii: "{")); needsComma = false }
    mutating func close() { bytes.append(UInt8(ascii: "}")); needsComma = true }
    mutating func openArray() { comma(); bytes.append(UInt8(ascii: "[")); needsComma = false }
    mutating func closeArray() { bytes.append(UInt8(ascii: "]")); needsComma = true }
    /// Drops everything written after `count` bytes (an element that did not fit a budget);
    /// the next element then follows a comma.
    mutating func truncate(to count: Int) {
        bytes.removeSubrange(min(count, bytes.count)...)
        needsComma = true
    }
    mutating func comma() { if needsComma { bytes.append(UInt8(ascii: ",")) }; needsComma = true }

    mutating func key(_ k: StaticString) {
        comma()
        bytes.append(UInt8(ascii: "\""))
        k.withUTF8Buffer { bytes.append(contentsOf: $0) }
        bytes.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        needsComma = false
    }
    mutating func string(_ s: String) { comma(); JSONWriter.string(s, to: &bytes) }
    mutating func int<I: BinaryInteger>(_ v: I) { comma(); JSONWriter.integer(v, to: &bytes) }
    mutating func number(_ v: Double) { comma(); JSONWriter.number(v, to: &bytes) }
    mutating func bool(_ v: Bool) { comma(); bytes.append(contentsOf: (v ? "true" : "false").utf8) }
    mutating func null() { comma(); bytes.append(contentsOf: "null".utf8) }
    mutating func time(_ t: Timestamp) {
        comma()
        bytes.append(UInt8(ascii: "\""))
        t.writeRFC3339(to: &bytes)
        bytes.append(UInt8(ascii: "\""))
    }
    mutating func value(_ v: JSONValue) { comma(); v.write(to: &bytes) }
    /// Splices already-encoded JSON.
    mutating func raw(_ b: [UInt8]) { comma(); bytes.append(contentsOf: b) }
}

extension OperationSnapshot {
    /// The status JSON of API.md; `admission`: what a create's admission did (its answer's
    /// `"admission"`), written first.
    func write(to o: inout JSONOut, admission: AdmissionOutcome? = nil) {
        o.open()
        if let admission { o.key("admission"); o.string(admission.rawValue) }
        o.key("id"); o.string(id.description)
        o.key("queue"); o.string(queue)
        if let name { o.key("name"); o.string(name) }
        o.key("kind"); o.string(kind)
        o.key("state"); o.string(state.rawValue)
        if let outcome { o.key("outcome"); o.string(outcome.rawValue) }
        o.key("isReady"); o.bool(isReady)
        o.key("isExecuting"); o.bool(isExecuting)
        o.key("isFinished"); o.bool(isFinished)
        o.key("isCancelled"); o.bool(isCancelled)
        o.key("isPaused"); o.bool(isPaused)
        o.key("queuePriority"); o.string(queuePriority.name)
        o.key("dependencies"); o.openArray()
        for d in dependencies { o.string(d.description) }
        o.closeArray()
        if let progress { o.key("progress"); progress.write(to: &o) }
        o.key("attempt"); o.int(attempt)
        if let spec { o.key("spec"); o.value(spec) }
        if let t = options.timeout { o.key("timeout"); o.number(t) }
        if let r = options.retry {
            o.key("retry"); o.open()
            o.key("maxAttempts"); o.int(r.maxAttempts)
            o.key("backoff"); o.number(r.backoff)
            o.key("multiplier"); o.number(r.multiplier)
            o.close()
        }
        if let nb = options.notBefore { o.key("notBefore"); o.time(nb) }
        if !options.limits.isEmpty {
            o.key("limits"); o.limits(options.limits)
        }
        if let f = options.fairnessKey { o.key("fairnessKey"); o.string(f) }
        if let schedule {
            o.key("schedule"); o.open()
            o.key("name"); o.string(schedule.name)
            o.key("nominalTime"); o.time(schedule.nominalTime)
            o.close()
        }
        if let waitingOn {
            o.key("waitingOn"); o.openArray()
            for w in waitingOn { w.write(to: &o) }
            o.closeArray()
        }
        if let result { o.key("result"); o.value(result) }
        if let error { o.key("error"); o.value(error) }
        o.key("createdAt"); o.time(createdAt)
        if let startedAt { o.key("startedAt"); o.time(startedAt) }
        if let finishedAt { o.key("finishedAt"); o.time(finishedAt) }
        o.key("revision"); o.int(revision)
        o.close()
    }

    package var json: [UInt8] {
        var o = JSONOut()
        write(to: &o)
        return o.bytes
    }
}

extension OperationProgress {
    func write(to o: inout JSONOut) {
        o.open()
        o.key("completed"); o.number(completed)
        o.key("total"); o.number(total)
        o.key("fractionCompleted"); o.number(fractionCompleted)
        o.close()
    }
}

extension QueueSnapshot {
    func write(to o: inout JSONOut) {
        o.open()
        o.key("name"); o.string(name)
        o.key("maxConcurrentOperationCount"); o.int(maxConcurrentOperationCount)
        o.key("effectiveMaxConcurrentOperationCount"); o.int(effectiveMaxConcurrentOperationCount)
        o.key("isSuspended"); o.bool(isSuspended)
        o.key("operationCount"); o.int(operationCount)
        o.key("counts"); o.open()
        for s in OperationState.allCases {
            o.comma()
            JSONWriter.string(s.rawValue, to: &o.bytes)
            o.bytes.append(UInt8(ascii: ":"))
            JSONWriter.integer(counts[s] ?? 0, to: &o.bytes)
        }
        o.close()
        o.key("rateLimit")
        if let rateLimit { rateLimit.write(to: &o) } else { o.null() }
        if !fairnessWeights.isEmpty {
            o.key("fairnessWeights"); o.weights(fairnessWeights)
        }
        o.key("revision"); o.int(revision)
        o.key("createdAt"); o.time(createdAt)
        o.close()
    }

    var json: [UInt8] {
        var o = JSONOut()
        write(to: &o)
        return o.bytes
    }
}

extension ChangeValue {
    func write(to o: inout JSONOut) {
        switch self {
        case .none: o.null()
        case let .bool(b): o.bool(b)
        case let .priority(p): o.string(p.name)
        case let .progress(p): p.write(to: &o)
        case let .int(n): o.int(n)
        case let .breaker(b): o.string(b.rawValue)
        }
    }
}

extension ChangeEvent {
    /// `{"seq","time","queue","operation","key","old","new","state"}`; a host's breaker change
    /// is `{"seq","time","host","key":"breaker","old","new"}` (API.md "Hosts").
    package var json: [UInt8] {
        var o = JSONOut(capacity: 200)
        o.open()
        if key == .breaker {
            o.key("seq"); o.int(seq)
            o.key("time"); o.time(time)
            o.key("host"); o.string(queue)
            o.key("key"); o.string(key.rawValue)
            o.key("old"); old.write(to: &o)
            o.key("new"); new.write(to: &o)
            o.close()
            return o.bytes
        }
        o.key("seq"); o.int(seq)
        o.key("time"); o.time(time)
        o.key("queue"); o.string(queue)
        o.key("operation"); o.string(operation.description)
        o.key("key"); o.string(key.rawValue)
        o.key("old"); old.write(to: &o)
        o.key("new"); new.write(to: &o)
        o.key("state"); o.string(state.rawValue)
        o.close()
        return o.bytes
    }
}
