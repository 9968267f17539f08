import QueueEngine

/// A history bucket as both stores keep it: one text column,
/// `created started succeeded failed cancelled|bin:count …|bin:count …` (the wait sketch's
/// non-empty bins, then the run sketch's). Reading refuses what this server never writes.
package enum HistoryText {
    package struct Refusal: Error {
        package let why: String
        init(_ why: String) { self.why = why }
    }

    package static func write(_ b: HistoryBucket) -> String {
        var s = "\(b.created) \(b.started) \(b.succeeded) \(b.failed) \(b.cancelled)"
        for sketch in [b.wait, b.run] {
            s += "|"
            var first = true
            for (i, c) in sketch.counts.enumerated() where c > 0 {
                if !first { s += " " }
                first = false
                s += "\(i):\(c)"
            }
        }
        return s
    }

    /// A stored row (its columns as read) back, or why not: `(column, why)`. Both stores use it.
    package static func row(queue: String, step: Int64, start: Int64, data: String?) -> Result<HistoryRow, DecodeFailure> {
        func fail(_ column: String, _ why: String) -> Result<HistoryRow, DecodeFailure> {
            .failure(DecodeFailure(detail: "history row \(queue.debugDescription)/\(step)/\(start): column \(column) \(why)"))
        }
        guard step == HistoryRing.minute || step == HistoryRing.hour else { return fail("step", "is not 60 or 3600") }
        guard start >= 0, start % step == 0 else { return fail("start", "is not a multiple of the step") }
        do throws(Refusal) {
            return .success(HistoryRow(queue: queue, step: step, bucket: try read(start: start, data ?? "")))
        } catch {
            return fail("data", error.why)
        }
    }

    package static func read(start: Int64, _ text: String) throws(Refusal) -> HistoryBucket {
        let parts = text.split(separator: "|", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw Refusal("is not `counts|wait|run`") }
        let fields = parts[0].split(separator: " ")
        let c = fields.compactMap { UInt64($0) }
        guard fields.count == 5, c.count == 5 else { throw Refusal("does not have 5 counts") }
        var b = HistoryBucket(start: start)
        (b.created, b.started, b.succeeded, b.failed, b.cancelled) = (c[0], c[1], c[2], c[3], c[4])
        b.wait = try sketch(parts[1])
        b.run = try sketch(parts[2])
        return b
    }

    private static func sketch(_ text: Substring) throws(Refusal) -> DurationSketch {
        var s = DurationSketch()
        for pair in text.split(separator: " ") {
            let kv = pair.split(separator: ":")
            guard kv.count == 2, let bin = Int(kv[0]), (0..<DurationSketch.bins).contains(bin), let n = UInt32(kv[1]) else {
                throw Refusal("has a sketch bin that is not `bin:count` with bin 0 to \(DurationSketch.bins - 1)")
            }
            s.set(bin: bin, n)
        }
        return s
    }
}
