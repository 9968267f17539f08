import Grammar
import MicroHTTP
import QueueEngine

/// A JSON object body, checked field by field. Every refusal names the field and what is
/// allowed, and is thrown before anything changes.
struct Body {
    let members: [(String, JSONValue)]

    /// Parses the body as an object with only `allowed` members. An empty body is `{}` when
    /// `emptyIsObject`.
    init(_ request: HTTPRequest, allowed: [String], emptyIsObject: Bool = false) throws(Problem) {
        if request.body.isEmpty {
            if emptyIsObject { try self.init(.object([]), field: "body", allowed: allowed); return }
            throw Problem.badRequest("a JSON object body is required")
        }
        // The Content-Type is not checked: `curl -d` sends form-urlencoded by default, and the
        // body is JSON or refused as malformed either way.
        let value: JSONValue
        do { value = try JSONValue.parse(request.body) } catch { throw Problem.badRequest(error.description) }
        try self.init(value, field: "body", allowed: allowed)
    }

    /// An object inside a body (an element of a batch), checked the same way; `field` names it
    /// when it is not an object.
    init(_ value: JSONValue, field: String, allowed: [String]) throws(Problem) {
        guard case let .object(m) = value else { throw Problem.invalid(field, "must be a JSON object; got \(value.typeName)") }
        var seen = Set<String>()
        for (k, _) in m {
            guard allowed.contains(k) else {
                throw Problem.invalid(k, "unknown field; allowed: \(allowed.joined(separator: ", "))")
            }
            guard seen.insert(k).inserted else { throw Problem.invalid(k, "appears more than once") }
        }
        members = m
    }

    subscript(_ key: String) -> JSONValue? {
        for (k, v) in members where k == key { return v }
        return nil
    }

    func string(_ key: String, maxLength: Int = 1024) throws(Problem) -> String? {
        guard let v = self[key] else { return nil }
        guard case let .string(s) = v else { throw Problem.invalid(key, "must be a string; got \(v.typeName)") }
        guard s.utf8.count <= maxLength else { throw Problem.invalid(key, "must be at most \(maxLength) bytes") }
        return s
    }

    func bool(_ key: String) throws(Problem) -> Bool? {
        guard let v = self[key] else { return nil }
        guard case let .bool(b) = v else { throw Problem.invalid(key, "must be true or false; got \(v.typeName)") }
        return b
    }

    func int(_ key: String, in range: ClosedRange<Int>, what: String) throws(Problem) -> Int? {
        guard let v = self[key] else { return nil }
        // `Int(exactly:)`: Double(Int.max) rounds up to 2^63, which `Int(_:)` would trap on.
        guard case let .number(n) = v, let i = Int(exactly: n), range.contains(i) else {
            throw Problem.invalid(key, "must be \(what); got \(v.text)")
        }
        return i
    }

    func number(_ key: String, in range: ClosedRange<Double>, what: String) throws(Problem) -> Double? {
        guard let v = self[key] else { return nil }
        guard case let .number(n) = v, range.contains(n) else { throw Problem.invalid(key, "must be \(what); got \(v.text)") }
        return n
    }
}

/// Query parameters, checked the same way.
package struct Query {
    let values: [String: String]
    package init(_ request: HTTPRequest, allowed: [String]) throws(Problem) {
        for k in request.query.keys where !allowed.contains(k) {
            throw Problem.invalid(k, "unknown query parameter; allowed: \(allowed.isEmpty ? "none" : allowed.joined(separator: ", "))")
        }
        // `?limit=0x10&limit=5` is ambiguous (which one counts?), as a repeated body field is.
        if let k = request.repeatedQueryNames.first { throw Problem.repeatedQueryParameter(k) }
        values = request.query
    }

    /// An integer parameter (`limit`, `after`, `max`, ...), read by the one grammar for
    /// numbers a client writes (``DecimalNumber``): decimal digits only.
    func int(_ key: String, in range: ClosedRange<Int>) throws(Problem) -> Int? {
        guard let s = values[key] else { return nil }
        switch DecimalNumber.integer(s, in: range) {
        case let .success(n): return n
        case let .failure(why): throw Self.refused(key, s, why, "an integer from \(range.lowerBound) to \(range.upperBound)", DecimalNumber.integerRule)
        }
    }

    /// A seconds parameter (`wait`, `timeout`): decimal digits with an optional fraction.
    func seconds(_ key: String, max: Double) throws(Problem) -> Double? {
        guard let s = values[key] else { return nil }
        switch DecimalNumber.decimal(s, in: 0...max) {
        case let .success(n): return n
        case let .failure(why): throw Self.refused(key, s, why, "a number of seconds from 0 to \(Int(max))", DecimalNumber.decimalRule)
        }
    }

    /// `key: must be WHAT, written as RULE; got 'TEXT': WHY`, the text cut to 64 characters.
    static func refused(_ key: String, _ text: String, _ why: DecimalNumber.Refusal, _ what: String, _ rule: String) -> Problem {
        Problem.invalid(key, why.explained(must: what, writtenAs: rule, got: shown(text)))
    }

    func bool(_ key: String) throws(Problem) -> Bool? {
        guard let s = values[key] else { return nil }
        switch s {
        case "true", "1": return true
        case "false", "0": return false
        default: throw Problem.invalid(key, "must be true or false; got '\(s)'")
        }
    }
}

/// A client's text in a problem detail: at most 64 characters, so a huge value does not make a
/// huge answer (the detail is JSON-escaped when written).
func shown(_ text: String) -> String {
    // By Unicode scalars, not Characters: one Character may hold a megabyte of combining marks.
    text.unicodeScalars.count <= 64 ? text : String(String.UnicodeScalarView(text.unicodeScalars.prefix(64))) + "…"
}

/// A time a client wrote in `field`: RFC 3339 with the calendar checked, from 1970 to 2261
/// (``RFC3339``, the one grammar for every date field). Anything else is 422 naming the field,
/// what was wrong and what is allowed.
func parseTime(_ v: JSONValue, field: String, nullAllowed: Bool = false) throws(Problem) -> Timestamp {
    let allowed = "must be \(RFC3339.rule)\(nullAllowed ? ", or null for none" : "")"
    guard case let .string(s) = v else { throw Problem.invalid(field, "\(allowed); got \(shown(v.text))") }
    switch RFC3339.nanoseconds(s) {
    case let .success(ns): return Timestamp(nanoseconds: ns)
    case let .failure(why): throw Problem.invalid(field, "\(allowed); got \"\(shown(s))\": \(why)")
    }
}

/// Parses the operation ids of a `dependencies` array.
func parseDependencies(_ v: JSONValue?, field: String = "dependencies", limit: Int = 200_000) throws(Problem) -> [OperationID]? {
    guard let v else { return nil }
    guard case let .array(items) = v else { throw Problem.invalid(field, "must be an array of operation ids; got \(v.typeName)") }
    guard items.count <= limit else {
        throw Problem(
            422, "too-many-dependencies", "Too many dependencies",
            "\(field): at most \(limit) dependencies per operation (--max-dependencies); got \(items.count)")
    }
    var ids: [OperationID] = []
    ids.reserveCapacity(items.count)
    for (i, item) in items.enumerated() {
        guard case let .string(s) = item else { throw Problem.invalid("\(field)[\(i)]", "must be an operation id string; got \(item.typeName)") }
        guard let id = OperationID(s) else {
            throw Problem(404, "not-found", "Not Found", "\(field)[\(i)]: no operation with id '\(s)'")
        }
        ids.append(id)
    }
    return ids
}

func parsePriority(_ v: JSONValue?) throws(Problem) -> QueuePriority? {
    guard let v else { return nil }
    guard case let .string(s) = v, let p = QueuePriority(name: s) else {
        throw Problem.invalid("queuePriority", "must be one of veryLow, low, normal, high, veryHigh; got \(v.text)")
    }
    return p
}

/// An operation id from a path; one that is not an id names no operation (404).
func parseOperationID(_ text: String) throws(Problem) -> OperationID {
    guard let id = OperationID(text) else { throw Problem.notFound("no operation with id '\(text)'") }
    return id
}
