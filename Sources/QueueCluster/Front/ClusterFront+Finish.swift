import Locking
import MicroHTTP
import OutboundHTTP
import QueueAPI
import QueueEngine

/// `POST /v1/operations:finish` for operations whose queues several instances own. The answer
/// is per element (API.md: "answers one status or problem per element"), so the request can be
/// split among the owners without changing what it means: each owner finishes its share in one
/// commit of its own and answers once that is durable, as it does for a whole request.
extension ClusterFront {
    /// One owner's share: its base URL and the indices of its elements in the request.
    struct FinishPart: Sendable {
        let url: String
        let indices: [Int]
    }

    /// Marks a share sent to its owner (`finishAcross`): it is never split again.
    static let splitPartHeader = "opqd-split-part"

    /// `list`, `member`: the body's list of finishes and each one's operation id member
    /// (`RouteScope.operationsInBody`).
    /// Checked whole before (`decide`: a malformed element refuses the whole request here,
    /// naming it, and nothing changes anywhere); every share goes to its owner at once, this
    /// instance's own through its own advertised URL like the others (one path for all). The
    /// entries come back in the request's order, each problem naming the element by its index
    /// in this request. A share whose owner did not answer, or answered the request as a whole
    /// with a problem, gives each of its elements that problem: 503 `owner-unavailable` says
    /// the finish may or may not have happened.
    func finishAcross(_ request: HTTPRequest, list: String, member: String, elements: [JSONValue], parts: [FinishPart]) -> HTTPHandlerResult {
        let sends = parts.map { part in
            var out = forwarder.outboundRequest(for: request, base: part.url)
            out.body = JSONValue.object([(list, .array(part.indices.map { elements[$0] }))]).bytes
            out.headers.append((Self.splitPartHeader, "1"))
            return out
        }
        let (client, cap, count) = (forwarder.client, forwarder.maxResponseBytes, elements.count)
        return .routed(
            "split",
            .deferred { responder in
                // Changes may be committed at the owners right now: answer them, not 503, at shutdown.
                responder.answerBeforeShutdown()
                let results = Locking.Lock<[Int: Result<OutboundResponse, OutboundError>]>([:])
                for (k, out) in sends.enumerated() {
                    _ = client.send(out) { result in
                        let all = results.withLock { r -> [Int: Result<OutboundResponse, OutboundError>]? in
                            r[k] = result
                            return r.count == parts.count ? r : nil
                        }
                        guard let all else { return }
                        responder.respond(
                            Self.merge(list: list, member: member, parts: parts, results: all, elements: elements, count: count, maxResponseBytes: cap))
                    }
                }
            })
    }

    /// The shares' entries in the request's order (see `finishAcross`).
    static func merge(
        list key: String, member: String, parts: [FinishPart], results: [Int: Result<OutboundResponse, OutboundError>], elements: [JSONValue], count: Int,
        maxResponseBytes: Int
    ) -> HTTPResponse {
        var entries = [JSONValue](repeating: .null, count: count)
        for (k, part) in parts.enumerated() {
            guard let result = results[k] else { continue }
            if case let .success(answer) = result, answer.status == 200, !answer.truncated, let body = try? JSONValue.parse(answer.body),
                case let .array(list)? = body[key], list.count == part.indices.count
            {
                for (j, entry) in list.enumerated() { entries[part.indices[j]] = renumbered(entry, in: key, from: j, to: part.indices[j]) }
                continue
            }
            // The share was not answered entry by entry: each of its elements gets the problem.
            let whole: HTTPResponse
            if case let .success(answer) = result, answer.status == 200 {
                whole =
                    Problem(
                        502, "owner-answer-unexpected", "Bad Gateway",
                        "the owner's answer to its share of the finishes is not one entry per element; they may or may not have finished"
                    ).response
            } else if case let .success(answer) = result, !answer.truncated {
                whole = HTTPResponse(status: answer.status, headers: answer.headers, body: answer.body)
            } else {
                whole = Forwarder.relay(result, maxResponseBytes: maxResponseBytes)
            }
            let problem = (try? JSONValue.parse(whole.body)) ?? .null
            for i in part.indices {
                entries[i] = .object([("id", elements[i][member] ?? .null), ("status", .number(Double(whole.status))), ("problem", problem)])
            }
        }
        return json(200, JSONValue.object([(key, .array(entries))]).bytes)
    }

    /// An entry whose problem names its element by its index in the share (`finishes[j]...`),
    /// renamed by its index in the request.
    static func renumbered(_ entry: JSONValue, in list: String, from j: Int, to i: Int) -> JSONValue {
        let old = "\(list)[\(j)]"
        guard j != i, case var .object(pairs) = entry, let p = pairs.firstIndex(where: { $0.0 == "problem" }), case var .object(problem) = pairs[p].1,
            let d = problem.firstIndex(where: { $0.0 == "detail" }), case let .string(detail) = problem[d].1, detail.hasPrefix(old)
        else { return entry }
        problem[d].1 = .string("\(list)[\(i)]" + detail.dropFirst(old.count))
        pairs[p].1 = .object(problem)
        return .object(pairs)
    }
}
