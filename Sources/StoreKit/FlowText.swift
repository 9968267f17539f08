import QueueEngine

/// The JSON columns of flow control (API.md "Flow control") as both stores write and read them:
/// an operation's `limits`, a queue's `fairnessWeights` and a limiter's `overrides`. Rates are
/// two plain columns (per second, burst) in both stores; `rate` checks them.
///
/// Reading refuses what opqd could never have written (the engine's own bounds), so that a
/// damaged or hand-edited row fails the start naming its column instead of reaching the engine.
/// The reasons are phrases that follow the column name: "column limits" + " has 9 entries".
package enum FlowText {
    // MARK: - writing

    /// `[{"limiter":"stripe","key":"acct-42"},...]`, in order. Callers write nothing (NULL) for
    /// no limits.
    package static func writeLimits(_ limits: [LimitRef], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "["))
        for (i, ref) in limits.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"limiter":"#.utf8)
            JSONWriter.string(ref.limiter, to: &out)
            out.append(contentsOf: #","key":"#.utf8)
            JSONWriter.string(ref.key, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "]"))
    }

    /// `{"tenant-a":3,...}`, keys sorted (a dictionary's order is not stable across runs).
    package static func writeWeights(_ weights: [String: Int], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        for (i, key) in weights.keys.sorted().enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            JSONWriter.string(key, to: &out)
            out.append(UInt8(ascii: ":"))
            JSONWriter.integer(weights[key] ?? 1, to: &out)
        }
        out.append(UInt8(ascii: "}"))
    }

    /// `{"<key>":{"concurrency":3,"rate":{"perSecond":2.5,"burst":5}},...}`, keys sorted; a
    /// budget's absent fields are left out.
    package static func writeOverrides(_ overrides: [String: LimiterBudget], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        for (i, key) in overrides.keys.sorted().enumerated() {
            guard let b = overrides[key] else { continue }
            if i > 0 { out.append(UInt8(ascii: ",")) }
            JSONWriter.string(key, to: &out)
            out.append(UInt8(ascii: ":"))
            out.append(UInt8(ascii: "{"))
            if let c = b.concurrency {
                out.append(contentsOf: #""concurrency":"#.utf8)
                JSONWriter.integer(c, to: &out)
            }
            if let r = b.rate {
                if b.concurrency != nil { out.append(UInt8(ascii: ",")) }
                out.append(contentsOf: #""rate":{"perSecond":"#.utf8)
                JSONWriter.number(r.perSecond, to: &out)
                out.append(contentsOf: #","burst":"#.utf8)
                JSONWriter.integer(r.burst, to: &out)
                out.append(UInt8(ascii: "}"))
            }
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "}"))
    }

    // MARK: - reading

    /// Why a value is refused: a phrase to follow the column's name.
    package struct Refusal: Error {
        package let why: String
        /// For a rate's two columns: whether its burst (not its per-second rate) is refused.
        package let inBurst: Bool
        package init(_ why: String, inBurst: Bool = false) { self.why = why; self.inBurst = inBurst }
        /// The rate's column refused, as both stores name them.
        package var rateColumn: String { inBurst ? "rate_burst" : "rate_per_second" }
    }

    /// A rate from its two columns (`rate_per_second`, `rate_burst`): both NULL is none; one
    /// without the other, a per-second rate that is not a number from 0.001 to 100,000, or a
    /// burst below 1 is refused (`Refusal.rateColumn` says which).
    package static func rate(perSecond: Double?, burst: Int64?) throws(Refusal) -> RateLimit? {
        switch (perSecond, burst) {
        case (nil, nil): return nil
        case let (nil, b?): throw Refusal("is NULL but rate_burst is \(b)")
        case let (p?, nil): throw Refusal("is NULL but rate_per_second is \(p)", inBurst: true)
        case let (p?, b?):
            guard p.isFinite, RateLimit.perSecondRange.contains(p) else { throw Refusal("is \(p), not from 0.001 to 100000") }
            guard let burst = Int(exactly: b), RateLimit.burstRange.contains(burst) else { throw Refusal("is \(b), not from 1 to 1000000000", inBurst: true) }
            return RateLimit(perSecond: p, burst: burst)
        }
    }

    /// A rate written as JSON inside an override: `{"perSecond", "burst"}`.
    static func rate(_ v: JSONValue) throws(Refusal) -> RateLimit {
        guard case let .number(p)? = v["perSecond"], case let .number(b)? = v["burst"] else { throw Refusal("has a rate without perSecond and burst") }
        guard p.isFinite, RateLimit.perSecondRange.contains(p) else { throw Refusal("has a rate of perSecond \(p)") }
        guard let burst = Int(exactly: b), RateLimit.burstRange.contains(burst) else { throw Refusal("has a rate of burst \(b)") }
        return RateLimit(perSecond: p, burst: burst)
    }

    /// An operation's `limits` column (NULL: none).
    package static func limits(_ bytes: [UInt8]?) throws(Refusal) -> [LimitRef] {
        guard let bytes else { return [] }
        guard let v = try? JSONValue.parse(bytes), case let .array(items) = v else { throw Refusal("is not a JSON array") }
        guard items.count <= LimitRef.maxPerOperation else { throw Refusal("has \(items.count) entries (at most \(LimitRef.maxPerOperation))") }
        var out: [LimitRef] = []
        out.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            guard case let .object(members) = item, members.count == 2, case let .string(limiter)? = item["limiter"],
                case let .string(key)? = item["key"]
            else { throw Refusal("entry \(i) is not {\"limiter\", \"key\"}") }
            guard isName(limiter) else { throw Refusal("entry \(i) names no limiter") }
            guard key.count <= LimitRef.maxKeyLength else { throw Refusal("entry \(i) has a key of \(key.count) characters") }
            let ref = LimitRef(limiter: limiter, key: key)
            guard !out.contains(ref) else { throw Refusal("names limiter \(limiter) with key \(key.debugDescription) twice") }
            out.append(ref)
        }
        return out
    }

    /// An operation's `fairness_key` column (NULL: none).
    package static func fairnessKey(_ key: String?) throws(Refusal) -> String? {
        guard let key else { return nil }
        guard key.count <= LimitRef.maxKeyLength else { throw Refusal("has \(key.count) characters") }
        return key
    }

    /// A queue's `fairness_weights` column (NULL: none).
    package static func weights(_ bytes: [UInt8]?) throws(Refusal) -> [String: Int] {
        guard let bytes else { return [:] }
        guard let v = try? JSONValue.parse(bytes), case let .object(members) = v else { throw Refusal("is not a JSON object") }
        guard members.count <= LimiterSettings.maxOverrides else { throw Refusal("has \(members.count) keys") }
        var out: [String: Int] = [:]
        for (key, value) in members {
            guard key.count <= LimitRef.maxKeyLength else { throw Refusal("has a key of \(key.count) characters") }
            guard case let .number(n) = value, let w = Int(exactly: n), (1...1000).contains(w) else {
                throw Refusal("has weight \(value) for \(key.debugDescription)")
            }
            guard out.updateValue(w, forKey: key) == nil else { throw Refusal("has \(key.debugDescription) twice") }
        }
        return out
    }

    /// A limiter's `overrides` column (NULL: none).
    package static func overrides(_ bytes: [UInt8]?) throws(Refusal) -> [String: LimiterBudget] {
        guard let bytes else { return [:] }
        guard let v = try? JSONValue.parse(bytes), case let .object(members) = v else { throw Refusal("is not a JSON object") }
        guard members.count <= LimiterSettings.maxOverrides else { throw Refusal("has \(members.count) keys") }
        var out: [String: LimiterBudget] = [:]
        for (key, value) in members {
            guard key.count <= LimitRef.maxKeyLength else { throw Refusal("has a key of \(key.count) characters") }
            guard case .object = value else { throw Refusal("has no budget for \(key.debugDescription)") }
            var budget = LimiterBudget()
            if let c = value["concurrency"] {
                guard case let .number(n) = c, let v = Int(exactly: n), LimiterBudget.concurrencyRange.contains(v) else {
                    throw Refusal("has concurrency \(c) for \(key.debugDescription)")
                }
                budget.concurrency = v
            }
            if let r = value["rate"] {
                do throws(Refusal) { budget.rate = try rate(r) } catch { throw Refusal("\(error.why) for \(key.debugDescription)") }
            }
            guard budget.concurrency != nil || budget.rate != nil else { throw Refusal("names neither concurrency nor rate for \(key.debugDescription)") }
            guard out.updateValue(budget, forKey: key) == nil else { throw Refusal("has \(key.debugDescription) twice") }
        }
        return out
    }

    /// A limiter's concurrency column (NULL: none).
    package static func concurrency(_ n: Int64?) throws(Refusal) -> Int? {
        guard let n else { return nil }
        guard let c = Int(exactly: n), LimiterBudget.concurrencyRange.contains(c) else { throw Refusal("is \(n)") }
        return c
    }

    /// A limiter's name, or a name in `limits`: the engine's `[A-Za-z0-9._-]{1,64}`.
    package static func isName(_ s: String) -> Bool {
        let u = s.utf8
        return (1...64).contains(u.count)
            && u.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2E || c == 0x5F || c == 0x2D
            }
    }
}
