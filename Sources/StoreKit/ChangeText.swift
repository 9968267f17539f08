import QueueEngine

/// The column text of a change event's old and new values.
package enum ChangeText {
    /// The JSON of a `ChangeValue` as both stores write it (`RecordBinder.addChange`, `PGRecordEncoder`).
    package static func decode(_ b: UnsafeRawBufferPointer) -> ChangeValue? {
        guard let first = b.first else { return nil }
        switch first {
        case UInt8(ascii: "t"): return .bool(true)
        case UInt8(ascii: "f"): return .bool(false)
        case UInt8(ascii: "\""):
            guard b.count >= 2 else { return nil }
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: b[1..<(b.count - 1)]), as: UTF8.self)
            if let p = QueuePriority(name: name) { return .priority(p) }
            return BreakerState(rawValue: name).map { .breaker($0) }
        case UInt8(ascii: "{"):
            guard let v = try? JSONValue.parse(Array(b)), case let .number(c)? = v["completed"], case let .number(t)? = v["total"] else { return nil }
            return .progress(OperationProgress(completed: c, total: t))
        default:
            return Int(String(decoding: b, as: UTF8.self)).map { .int($0) }
        }
    }
}
