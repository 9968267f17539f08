import MicroHTTP
import QueueEngine

/// What parses the body of a create (and of a batch's elements): the engine, for its kinds
/// and their refusals, and the limits. `OperationsController` and `BatchParser` parse alike.
package protocol CreateBodyParsing: Sendable {
    var engine: QueueEngine { get }
    var limits: APILimits { get }
}

/// A batch's elements parsed as `POST /v1/operations:batch` parses them, for the instance that
/// decides a batch across instances, and for an owner that adds its part from the store.
package struct BatchParser: CreateBodyParsing {
    package let engine: QueueEngine
    package let limits: APILimits
    package init(engine: QueueEngine, limits: APILimits) {
        self.engine = engine
        self.limits = limits
    }
}

extension CreateBodyParsing {
    /// The fields of a create body, less `dependencies` (a batch reads those its own way).
    func parseRequest(_ b: Body) throws -> OperationRequest {
        // Which kinds exist, what their specs allow, their default retry and their refusals are
        // the kinds' own business (`OperationKind`); the engine asks them.
        guard let kind = try b.string("kind", maxLength: 64) else {
            throw Problem.invalid("kind", "is required: one of \(engine.kindNames.joined(separator: ", "))")
        }
        // An unknown kind, or a spec the kind will not run here (403), before the other fields.
        try engine.checkPermitted(kind: kind, spec: b["spec"])
        var request = OperationRequest(kind: kind)
        request.name = try b.string("name", maxLength: 256)
        request.queuePriority = try parsePriority(b["queuePriority"]) ?? .normal
        request.spec = b["spec"]
        request.options.timeout = try b.number("timeout", in: 0.001...31_536_000, what: "a number of seconds from 0.001 to 31536000")
        if let r = b["retry"] { request.options.retry = try parseRetry(r) }
        if let nb = b["notBefore"] { request.options.notBefore = try parseTime(nb, field: "notBefore") }
        if let l = b["limits"] { request.options.limits = try FlowParsing.limits(l) }
        if let f = b["fairnessKey"] { request.options.fairnessKey = try FlowParsing.fairnessKey(f) }
        if let a = b["admission"] { request.admission = try parseAdmission(a) }
        return request
    }

    /// `{"debounce": {"key", "seconds", "maxSeconds"?}}` or `{"singleton": {"key", "mode"}}`
    /// (API.md "Admission").
    func parseAdmission(_ v: JSONValue) throws(Problem) -> Admission {
        guard case let .object(members) = v, members.count == 1, let (which, body) = members.first else {
            throw Problem.invalid("admission", "must be an object with one member: {\"debounce\": {key, seconds, maxSeconds?}} or {\"singleton\": {key, mode}}")
        }
        let field = "admission.\(which)"
        let allowed: [String]
        switch which {
        case "debounce": allowed = ["key", "seconds", "maxSeconds"]
        case "singleton": allowed = ["key", "mode"]
        default: throw Problem.invalid("admission.\(which)", "unknown admission; allowed: debounce, singleton")
        }
        guard case let .object(fields) = body else {
            throw Problem.invalid(field, "must be an object {\(allowed.joined(separator: ", "))}; got \(body.typeName)")
        }
        var seen = Set<String>()
        for (k, _) in fields {
            guard allowed.contains(k) else { throw Problem.invalid("\(field).\(k)", "unknown field; allowed: \(allowed.joined(separator: ", "))") }
            guard seen.insert(k).inserted else { throw Problem.invalid("\(field).\(k)", "appears more than once") }
        }
        func value(_ k: String) -> JSONValue? { fields.first { $0.0 == k }?.1 }
        guard case let .string(key)? = value("key"), AdmissionTag.isKey(key) else {
            throw Problem.invalid(
                "\(field).key",
                "is required: a string of 1 to \(Admission.maxKeyLength) characters, no control characters; got \(value("key")?.text ?? "nothing")")
        }
        if which == "singleton" {
            guard case let .string(m)? = value("mode"), let mode = SingletonMode(rawValue: m) else {
                throw Problem.invalid("\(field).mode", "is required: skip or replaceWaiting; got \(value("mode")?.text ?? "nothing")")
            }
            return .singleton(key: key, mode: mode)
        }
        guard case let .number(seconds)? = value("seconds"), Admission.secondsRange.contains(seconds) else {
            throw Problem.invalid("\(field).seconds", "is required: a number of seconds from 0.001 to 604800; got \(value("seconds")?.text ?? "nothing")")
        }
        var maxSeconds = min(seconds * 10, Admission.maxSecondsLimit)
        if let m = value("maxSeconds") {
            guard case let .number(n) = m, n >= seconds, n <= Admission.maxSecondsLimit else {
                throw Problem.invalid("\(field).maxSeconds", "must be a number of seconds from seconds (\(seconds)) to 31536000; got \(m.text)")
            }
            maxSeconds = n
        }
        return .debounce(key: key, seconds: seconds, maxSeconds: maxSeconds)
    }

    func parseRetry(_ v: JSONValue) throws(Problem) -> RetryPolicy {
        guard case let .object(members) = v else { throw Problem.invalid("retry", "must be an object {maxAttempts, backoff, multiplier}; got \(v.typeName)") }
        var p = RetryPolicy()
        for (k, value) in members {
            switch (k, value) {
            case let ("maxAttempts", .number(n)) where n == n.rounded() && n >= 1 && n <= 100: p.maxAttempts = Int(n)
            case ("maxAttempts", _): throw Problem.invalid("retry.maxAttempts", "must be an integer from 1 to 100; got \(value.text)")
            case let ("backoff", .number(n)) where n >= 0 && n <= 86400: p.backoff = n
            case ("backoff", _): throw Problem.invalid("retry.backoff", "must be a number of seconds from 0 to 86400; got \(value.text)")
            case let ("multiplier", .number(n)) where n >= 1 && n <= 10: p.multiplier = n
            case ("multiplier", _): throw Problem.invalid("retry.multiplier", "must be a number from 1 to 10; got \(value.text)")
            default: throw Problem.invalid("retry.\(k)", "unknown field; allowed: maxAttempts, backoff, multiplier")
            }
        }
        return p
    }

}
