import MicroHTTP
import QueueEngine

/// The flow-control fields of bodies (API.md "Flow control"): every refusal names the field
/// and what is allowed, before anything changes.
enum FlowParsing {
    static let rateRule = "an object {\"perSecond\": 0.001 to 100000, \"burst\"?: an integer from 1 to 1000000000}"

    /// `{"perSecond", "burst"?}`; `burst` defaults to `max(1, ceil(perSecond))`.
    static func rate(_ v: JSONValue, field: String) throws(Problem) -> RateLimit {
        guard case let .object(members) = v else { throw Problem.invalid(field, "must be \(rateRule); got \(v.typeName)") }
        var perSecond: Double?
        var burst: Int?
        var seen = Set<String>()
        for (k, value) in members {
            guard seen.insert(k).inserted else { throw Problem.invalid("\(field).\(k)", "appears more than once") }
            switch k {
            case "perSecond":
                guard case let .number(n) = value, n.isFinite, RateLimit.perSecondRange.contains(n) else {
                    throw Problem.invalid("\(field).perSecond", "must be a number from 0.001 to 100000; got \(shown(value.text))")
                }
                perSecond = n
            case "burst":
                guard case let .number(n) = value, let i = Int(exactly: n), RateLimit.burstRange.contains(i) else {
                    throw Problem.invalid("\(field).burst", "must be an integer from 1 to 1000000000; got \(shown(value.text))")
                }
                burst = i
            default:
                throw Problem.invalid("\(field).\(shown(k))", "unknown field; allowed: perSecond, burst")
            }
        }
        guard let perSecond else { throw Problem.invalid("\(field).perSecond", "is required: a number from 0.001 to 100000") }
        return RateLimit(perSecond: perSecond, burst: burst ?? RateLimit.defaultBurst(perSecond))
    }

    /// A queue's `rateLimit`: a rate, or `null` for none.
    static func queueRate(_ v: JSONValue) throws(Problem) -> RateLimit? {
        if case .null = v { return nil }
        return try rate(v, field: "rateLimit")
    }

    /// `{"<key>": weight}`, weights integers from 1 to 1000, keys up to 128 characters.
    static func weights(_ v: JSONValue, field: String = "fairnessWeights") throws(Problem) -> [String: Int] {
        guard case let .object(members) = v else { throw Problem.invalid(field, "must be an object of fairness key to weight; got \(v.typeName)") }
        guard members.count <= LimiterSettings.maxOverrides else {
            throw Problem.invalid(field, "at most \(LimiterSettings.maxOverrides) keys; got \(members.count)")
        }
        var out: [String: Int] = [:]
        for (k, value) in members {
            guard k.unicodeScalars.count <= LimitRef.maxKeyLength else {
                throw Problem.invalid(field, "a key is at most \(LimitRef.maxKeyLength) characters; got one of \(k.unicodeScalars.count)")
            }
            guard out[k] == nil else { throw Problem.invalid("\(field).\(shown(k))", "appears more than once") }
            guard case let .number(n) = value, let i = Int(exactly: n), (1...1000).contains(i) else {
                throw Problem.invalid("\(field).\(shown(k))", "must be an integer from 1 to 1000; got \(shown(value.text))")
            }
            out[k] = i
        }
        return out
    }

    /// An operation's `limits`: `[{"limiter", "key"?}]`, at most 8.
    static func limits(_ v: JSONValue, field: String = "limits") throws(Problem) -> [LimitRef] {
        guard case let .array(items) = v else { throw Problem.invalid(field, "must be an array of {\"limiter\", \"key\"?}; got \(v.typeName)") }
        guard items.count <= LimitRef.maxPerOperation else {
            throw Problem.invalid(field, "at most \(LimitRef.maxPerOperation) limits per operation; got \(items.count)")
        }
        var out: [LimitRef] = []
        for (i, item) in items.enumerated() {
            let f = "\(field)[\(i)]"
            guard case let .object(members) = item else { throw Problem.invalid(f, "must be an object {\"limiter\", \"key\"?}; got \(item.typeName)") }
            var limiter: String?
            var key: String?
            for (k, value) in members {
                switch k {
                case "limiter":
                    guard limiter == nil else { throw Problem.invalid("\(f).limiter", "appears more than once") }
                    guard case let .string(s) = value else { throw Problem.invalid("\(f).limiter", "must be a limiter's name; got \(value.typeName)") }
                    limiter = s
                case "key":
                    guard key == nil else { throw Problem.invalid("\(f).key", "appears more than once") }
                    guard case let .string(s) = value else {
                        throw Problem.invalid("\(f).key", "must be a string of at most 128 characters; got \(value.typeName)")
                    }
                    guard s.unicodeScalars.count <= LimitRef.maxKeyLength else {
                        throw Problem.invalid("\(f).key", "must be at most \(LimitRef.maxKeyLength) characters; got \(s.unicodeScalars.count)")
                    }
                    key = s
                default:
                    throw Problem.invalid("\(f).\(shown(k))", "unknown field; allowed: limiter, key")
                }
            }
            guard let limiter else { throw Problem.invalid("\(f).limiter", "is required: the name of a limiter") }
            out.append(LimitRef(limiter: limiter, key: key ?? ""))
        }
        return out
    }

    /// `fairnessKey`: a string of at most 128 characters.
    static func fairnessKey(_ v: JSONValue, field: String = "fairnessKey") throws(Problem) -> String {
        guard case let .string(s) = v else { throw Problem.invalid(field, "must be a string of at most 128 characters; got \(v.typeName)") }
        guard s.unicodeScalars.count <= LimitRef.maxKeyLength else {
            throw Problem.invalid(field, "must be at most \(LimitRef.maxKeyLength) characters; got \(s.unicodeScalars.count)")
        }
        return s
    }

    static let concurrencyRule = "an integer from 1 to 1000000000"

    static func concurrency(_ v: JSONValue, field: String) throws(Problem) -> Int {
        guard case let .number(n) = v, let i = Int(exactly: n), LimiterBudget.concurrencyRange.contains(i) else {
            throw Problem.invalid(field, "must be \(concurrencyRule); got \(shown(v.text))")
        }
        return i
    }

    /// `overrides`: `{"<key>": {"concurrency"?, "rate"?}}`.
    static func overrides(_ v: JSONValue) throws(Problem) -> [String: LimiterBudget] {
        guard case let .object(members) = v else { throw Problem.invalid("overrides", "must be an object of key to {concurrency?, rate?}; got \(v.typeName)") }
        guard members.count <= LimiterSettings.maxOverrides else {
            throw Problem.invalid("overrides", "at most \(LimiterSettings.maxOverrides) keys; got \(members.count)")
        }
        var out: [String: LimiterBudget] = [:]
        for (key, value) in members {
            guard key.unicodeScalars.count <= LimitRef.maxKeyLength else {
                throw Problem.invalid("overrides", "a key is at most \(LimitRef.maxKeyLength) characters; got one of \(key.unicodeScalars.count)")
            }
            let f = "overrides.\(shown(key))"
            guard out[key] == nil else { throw Problem.invalid(f, "appears more than once") }
            guard case let .object(fields) = value else { throw Problem.invalid(f, "must be an object {concurrency?, rate?}; got \(value.typeName)") }
            var budget = LimiterBudget()
            var seen = Set<String>()
            for (k, x) in fields {
                guard seen.insert(k).inserted else { throw Problem.invalid("\(f).\(shown(k))", "appears more than once") }
                switch k {
                case "concurrency": budget.concurrency = try concurrency(x, field: "\(f).concurrency")
                case "rate": budget.rate = try rate(x, field: "\(f).rate")
                default: throw Problem.invalid("\(f).\(shown(k))", "unknown field; allowed: concurrency, rate")
                }
            }
            guard budget.concurrency != nil || budget.rate != nil else { throw Problem.invalid(f, "must name concurrency, rate or both") }
            out[key] = budget
        }
        return out
    }
}

extension JSONOut {
    /// An operation's `limits`, as given: a key left out is the key "", and is not shown.
    mutating func limits(_ limits: [LimitRef]) {
        openArray()
        for l in limits {
            open()
            key("limiter"); string(l.limiter)
            if !l.key.isEmpty { key("key"); string(l.key) }
            close()
        }
        closeArray()
    }

    /// A queue's `fairnessWeights`, keys sorted.
    mutating func weights(_ weights: [String: Int]) {
        open()
        for k in weights.keys.sorted() {
            comma()
            JSONWriter.string(k, to: &bytes)
            bytes.append(UInt8(ascii: ":"))
            JSONWriter.integer(weights[k] ?? 1, to: &bytes)
        }
        close()
    }
}

extension RateLimit {
    func write(to o: inout JSONOut) {
        o.open()
        o.key("perSecond"); o.number(perSecond)
        o.key("burst"); o.int(burst)
        o.close()
    }
}

extension WaitReason {
    func write(to o: inout JSONOut) {
        o.open()
        switch self {
        case let .dependencies(count):
            o.key("type"); o.string("dependencies")
            o.key("count"); o.int(count)
        case .paused:
            o.key("type"); o.string("paused")
        case let .notBefore(until):
            o.key("type"); o.string("notBefore")
            o.key("until"); o.time(until)
        case let .debounce(until):
            o.key("type"); o.string("debounce")
            o.key("until"); o.time(until)
        case let .backoff(until):
            o.key("type"); o.string("backoff")
            o.key("until"); o.time(until)
        case .suspended:
            o.key("type"); o.string("suspended")
        case .concurrency:
            o.key("type"); o.string("concurrency")
        case let .rate(until):
            o.key("type"); o.string("rate")
            o.key("until"); o.time(until)
        case let .limiter(name, key, reason, until):
            o.key("type"); o.string("limiter")
            o.key("limiter"); o.string(name)
            o.key("key"); o.string(key)
            o.key("reason"); o.string(reason.rawValue)
            if let until { o.key("until"); o.time(until) }
        case let .host(host, state, until):
            o.key("type"); o.string("host")
            o.key("host"); o.string(host)
            o.key("state"); o.string(state)
            if let until { o.key("until"); o.time(until) }
        }
        o.close()
    }
}

extension LimiterSnapshot {
    func write(to o: inout JSONOut) {
        o.open()
        o.key("name"); o.string(name)
        o.key("concurrency")
        if let c = settings.concurrency { o.int(c) } else { o.null() }
        o.key("rate")
        if let r = settings.rate { r.write(to: &o) } else { o.null() }
        o.key("overrides"); o.open()
        for key in settings.overrides.keys.sorted() {
            guard let b = settings.overrides[key] else { continue }
            o.comma()
            JSONWriter.string(key, to: &o.bytes)
            o.bytes.append(UInt8(ascii: ":"))
            o.bytes.append(UInt8(ascii: "{"))
            var inner = JSONOut()
            if let c = b.concurrency { inner.key("concurrency"); inner.int(c) }
            if let r = b.rate { inner.key("rate"); r.write(to: &inner) }
            o.bytes.append(contentsOf: inner.bytes)
            o.bytes.append(UInt8(ascii: "}"))
        }
        o.close()
        o.key("running"); o.int(running)
        o.key("waiting"); o.int(waiting)
        o.key("keys"); o.int(keys)
        o.key("createdAt"); o.time(createdAt)
        o.key("revision"); o.int(revision)
        o.close()
    }

    var json: [UInt8] {
        var o = JSONOut()
        write(to: &o)
        return o.bytes
    }
}

extension LimiterKeyStatus {
    func write(to o: inout JSONOut) {
        o.open()
        o.key("key"); o.string(key)
        o.key("running"); o.int(running)
        o.key("waiting"); o.int(waiting)
        o.key("tokens")
        if let tokens { o.number((tokens * 1000).rounded(.down) / 1000) } else { o.null() }
        o.key("nextTokenAt")
        if let nextTokenAt { o.time(nextTokenAt) } else { o.null() }
        o.close()
    }
}
