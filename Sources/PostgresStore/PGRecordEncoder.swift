import QueueEngine
import StoreKit

/// One column of a bulk statement: a PostgreSQL array literal (`{1,"a b",NULL}`) built in place,
/// sent as one text parameter. Elements are quoted and escaped by the array syntax's own rules
/// (a backslash before `"` and `\`), so any text is carried as it is.
struct ArrayColumn {
    private(set) var bytes: [UInt8] = [UInt8(ascii: "{")]
    private var empty = true

    mutating func reset() {
        bytes.removeAll(keepingCapacity: true)
        bytes.append(UInt8(ascii: "{"))
        empty = true
    }

    private mutating func separate() {
        if !empty { bytes.append(UInt8(ascii: ",")) }
        empty = false
    }

    mutating func null() {
        separate()
        bytes.append(contentsOf: "NULL".utf8)
    }

    mutating func int(_ n: some BinaryInteger) {
        separate()
        JSONWriter.integer(n, to: &bytes)
    }

    mutating func int(_ n: (some BinaryInteger)?) {
        if let n { int(n) } else { null() }
    }

    /// An id, seq or revision. The engine keeps them far below 2^63; one above would be written
    /// negative (and refused when read back) rather than be refused by the server, which would
    /// stall the writer.
    mutating func counter(_ n: UInt64) {
        int(Int64(bitPattern: n))
    }

    mutating func bool(_ b: Bool) {
        separate()
        bytes.append(b ? UInt8(ascii: "t") : UInt8(ascii: "f"))
    }

    /// PostgreSQL's spelling of the values Swift prints as `nan` and `inf`; finite values in
    /// Swift's shortest round-tripping form.
    mutating func double(_ d: Double?) {
        guard let d else { null(); return }
        separate()
        if d.isNaN {
            bytes.append(contentsOf: "NaN".utf8)
        } else if d.isInfinite {
            bytes.append(contentsOf: (d < 0 ? "-Infinity" : "Infinity").utf8)
        } else {
            bytes.append(contentsOf: "\(d)".utf8)
        }
    }

    mutating func text(_ s: String?) {
        guard let s else { null(); return }
        quoted(s.utf8)
    }

    /// A text element written by `write` (JSON, an array literal) into `scratch`.
    mutating func text(_ scratch: inout [UInt8], _ write: (inout [UInt8]) -> Void) {
        scratch.removeAll(keepingCapacity: true)
        write(&scratch)
        quoted(scratch)
    }

    /// A bytea element: `\x` and hex digits, quoted (its backslash escaped for the array syntax).
    mutating func bytea(_ b: (some Sequence<UInt8>)?) {
        guard let b else { null(); return }
        separate()
        bytes.append(contentsOf: #""\\x"#.utf8)
        for byte in b {
            bytes.append(hexDigits[Int(byte >> 4)])
            bytes.append(hexDigits[Int(byte & 15)])
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private mutating func quoted(_ s: some Sequence<UInt8>) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        for c in s {
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") { bytes.append(UInt8(ascii: "\\")) }
            bytes.append(c)
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// The finished literal as a parameter.
    var parameter: PGParameter { PGParameter(bytes: bytes + [UInt8(ascii: "}"), 0]) }
}

/// The rows of one bulk statement per table, column by column.
struct BulkRows {
    var operations = [ArrayColumn](repeating: ArrayColumn(), count: 30)
    var events = [ArrayColumn](repeating: ArrayColumn(), count: 9)
    /// The ownership epoch the events are written under (NULL without fencing).
    var epoch: Int64?
    var queues = [ArrayColumn](repeating: ArrayColumn(), count: 16)
    var operationCount = 0, eventCount = 0, queueCount = 0
    /// The last queue added (a batch of one is sent with plain parameters, `PGSchema.upsertQueue`).
    var lastQueue: QueueSnapshot?
    private var scratch: [UInt8] = []

    mutating func reset() {
        for i in operations.indices { operations[i].reset() }
        for i in events.indices { events[i].reset() }
        for i in queues.indices { queues[i].reset() }
        operationCount = 0; eventCount = 0; queueCount = 0
        lastQueue = nil
    }

    mutating func add(_ s: OperationSnapshot) {
        operationCount += 1
        operations[0].counter(s.id.raw)
        operations[1].text(s.queue)
        operations[2].bytea(s.name?.utf8)
        operations[3].text(s.kind)
        Self.json(s.spec, &operations[4], &scratch)
        operations[5].int(s.queuePriority.rawValue)
        operations[6].text(s.state.rawValue)
        operations[7].text(s.outcome?.rawValue)
        operations[8].bool(s.isCancelled)
        operations[9].text(&scratch) { out in
            out.append(UInt8(ascii: "{"))
            for (i, d) in s.dependencies.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.integer(Int64(bitPattern: d.raw), to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
        operations[10].double(s.progress?.completed)
        operations[11].double(s.progress?.total)
        operations[12].int(s.attempt)
        Self.json(s.result, &operations[13], &scratch)
        Self.json(s.error, &operations[14], &scratch)
        operations[15].int(s.createdAt.nanoseconds)
        operations[16].int(s.startedAt?.nanoseconds)
        operations[17].int(s.finishedAt?.nanoseconds)
        operations[18].counter(s.revision)
        operations[19].double(s.options.timeout)
        if let r = s.options.retry {
            operations[20].text(&scratch) { out in
                out.append(contentsOf: #"{"maxAttempts":"#.utf8)
                JSONWriter.integer(r.maxAttempts, to: &out)
                out.append(contentsOf: #","backoff":"#.utf8)
                JSONWriter.number(r.backoff, to: &out)
                out.append(contentsOf: #","multiplier":"#.utf8)
                JSONWriter.number(r.multiplier, to: &out)
                out.append(UInt8(ascii: "}"))
            }
        } else {
            operations[20].null()
        }
        operations[21].int(s.options.notBefore?.nanoseconds)
        operations[22].double(s.executedSeconds)
        Self.json(s.kindState, &operations[23], &scratch)
        operations[24].int(s.cascadeAt?.nanoseconds)
        // Most operations name no limiter: NULL, with nothing written.
        if s.options.limits.isEmpty {
            operations[25].null()
        } else {
            operations[25].text(&scratch) { FlowText.writeLimits(s.options.limits, to: &$0) }
        }
        operations[26].bytea(s.options.fairnessKey?.utf8)
        if let tag = s.schedule {
            operations[27].text(tag.name)
            operations[28].int(tag.nominalTime.nanoseconds)
        } else {
            operations[27].null()
            operations[28].int(Int64?.none)
        }
        if let a = s.admission { operations[29].text(a.text) } else { operations[29].null() }
    }

    mutating func add(_ q: QueueSnapshot) {
        queueCount += 1
        lastQueue = q
        queues[0].text(q.name)
        queues[1].int(q.maxConcurrentOperationCount)
        queues[2].int(q.effectiveMaxConcurrentOperationCount)
        queues[3].bool(q.isSuspended)
        queues[4].counter(q.revision)
        queues[5].int(q.createdAt.nanoseconds)
        queues[6].counter(q.generation)
        queues[7].int(q.operationCount)
        for (i, s) in OperationState.allCases.enumerated() { queues[8 + i].int(q.counts[s] ?? 0) }
        queues[13].double(q.rateLimit?.perSecond)
        queues[14].int(q.rateLimit?.burst)
        if q.fairnessWeights.isEmpty {
            queues[15].null()
        } else {
            queues[15].text(&scratch) { FlowText.writeWeights(q.fairnessWeights, to: &$0) }
        }
    }

    mutating func add(_ e: ChangeEvent) {
        eventCount += 1
        events[0].counter(e.seq)
        events[1].int(e.time.nanoseconds)
        events[2].text(e.queue)
        events[3].counter(e.operation.raw)
        events[4].text(e.key.rawValue)
        Self.change(e.old, &events[5], &scratch)
        Self.change(e.new, &events[6], &scratch)
        events[7].text(e.state.rawValue)
        events[8].int(epoch)
    }

    private static func json(_ v: JSONValue?, _ column: inout ArrayColumn, _ scratch: inout [UInt8]) {
        guard let v else { column.null(); return }
        column.text(&scratch) { v.write(to: &$0) }
    }

    /// As the SQLite store writes them (`RecordBinder.addChange`): `none` is NULL, the other
    /// cases have distinct JSON types.
    private static func change(_ v: ChangeValue, _ column: inout ArrayColumn, _ scratch: inout [UInt8]) {
        switch v {
        case .none: column.null()
        case let .bool(b): column.text(b ? "true" : "false")
        case let .int(n): column.text(&scratch) { JSONWriter.integer(n, to: &$0) }
        case let .priority(p): column.text(&scratch) { JSONWriter.string(p.name, to: &$0) }
        case let .breaker(b): column.text(&scratch) { JSONWriter.string(b.rawValue, to: &$0) }
        case let .progress(p):
            column.text(&scratch) { out in
                out.append(contentsOf: #"{"completed":"#.utf8)
                JSONWriter.number(p.completed, to: &out)
                out.append(contentsOf: #","total":"#.utf8)
                JSONWriter.number(p.total, to: &out)
                out.append(UInt8(ascii: "}"))
            }
        }
    }
}
