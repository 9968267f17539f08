import Foundation
import TestKit

/// One event of the change feed.
struct FeedEvent: @unchecked Sendable {  // `new` is a JSON value, never mutated
    let seq: Int
    let queue: String
    let operation: String
    let key: String
    let new: Any?
    let state: String
    /// The event as sorted-key JSON, to compare feeds event by event.
    let canonical: String

    init?(_ object: [String: Any]) {
        guard let seq = (object["seq"] as? NSNumber)?.intValue, let queue = object["queue"] as? String,
            let operation = object["operation"] as? String, let key = object["key"] as? String, let state = object["state"] as? String,
            let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        else { return nil }
        (self.seq, self.queue, self.operation, self.key, self.state) = (seq, queue, operation, key, state)
        new = object["new"]
        canonical = String(decoding: data, as: UTF8.self)
    }

    var isTrue: Bool { new as? Bool == true }
    var isFalse: Bool { new as? Bool == false }
}

/// The whole feed of one instance and what it says about every operation.
struct Feed {
    let events: [FeedEvent]

    /// Reads `GET /v1/events?after=…&limit=1000` page by page from `node` until a page is
    /// empty (bounded: `timeout` seconds in all).
    static func read(from node: ClusterNode, timeout: Double = 20) throws -> Feed {
        let deadline = monotonicSeconds() + timeout
        var after = 0
        var events: [FeedEvent] = []
        while true {
            guard monotonicSeconds() < deadline else { throw TestClientError("opqd #\(node.index): the feed was still paging after \(timeout) s") }
            let r = try node.request("GET", "/v1/events?after=\(after)&limit=1000")
            guard r.status == 200 else { throw Unexpected("opqd #\(node.index): GET /v1/events?after=\(after)", r) }
            let page = r.objects("events")
            if page.isEmpty { break }
            for object in page {
                guard let e = FeedEvent(object) else { throw Unexpected("opqd #\(node.index): an event without seq/queue/operation/key/state", r) }
                events.append(e)
            }
            guard let last = events.last?.seq, last > after else { throw Unexpected("opqd #\(node.index): the feed did not move past \(after)", r) }
            after = last
        }
        return Feed(events: events)
    }

    /// Reads every node's feed, re-reading each until it reaches the highest last seq any of
    /// them showed (followers serve the feed from PostgreSQL; bounded by `timeout`). A node
    /// whose feed cannot be read is left out, with why in `problems`.
    static func readAll(from nodes: [ClusterNode], timeout: Double = 15) -> (feeds: [(node: ClusterNode, feed: Feed)], problems: [String]) {
        let deadline = monotonicSeconds() + timeout
        var feeds: [(node: ClusterNode, feed: Feed)] = []
        var problems: [String] = []
        for node in nodes {
            do { feeds.append((node, try read(from: node))) } catch { problems.append("the feed of opqd #\(node.index): \(error)") }
        }
        while true {
            let top = feeds.map(\.feed.lastSeq).max() ?? 0
            let behind = feeds.indices.filter { feeds[$0].feed.lastSeq < top }
            if behind.isEmpty || monotonicSeconds() > deadline { break }
            usleep(100_000)
            for i in behind {
                if let again = try? read(from: feeds[i].node) { feeds[i].feed = again }
            }
        }
        // Each feed gap-free, and all the same as the first.
        for (node, feed) in feeds { problems += feed.sequenceProblems("opqd #\(node.index)") }
        if let (first, base) = feeds.first {
            for (node, feed) in feeds.dropFirst() { problems += base.differences(from: feed, "opqd #\(first.index)", "opqd #\(node.index)") }
        }
        return (feeds, problems)
    }

    var lastSeq: Int { events.last?.seq ?? 0 }

    /// Seqs start at 1 and go up by exactly one: no gap, no duplicate, no reordering.
    func sequenceProblems(_ label: String) -> [String] {
        var problems: [String] = []
        var expected = 1
        for e in events {
            if e.seq != expected {
                problems.append("\(label): seq \(e.seq) where \(expected) was due (\(e.seq < expected ? "duplicate or out of order" : "gap"))")
                if problems.count > 10 { break }
            }
            expected = e.seq + 1
        }
        return problems
    }

    /// Where `other` differs from this feed (nothing when identical event for event).
    func differences(from other: Feed, _ label: String, _ otherLabel: String) -> [String] {
        if events.count != other.events.count {
            let diverge = (0..<min(events.count, other.events.count)).first { events[$0].canonical != other.events[$0].canonical }
            return [
                "\(label) has \(events.count) events (last seq \(lastSeq)), \(otherLabel) \(other.events.count) (last seq \(other.lastSeq))"
                    + (diverge.map { "; first difference at index \($0): \(events[$0].canonical) vs \(other.events[$0].canonical)" } ?? "")
            ]
        }
        var problems: [String] = []
        for (a, b) in zip(events, other.events) where a.canonical != b.canonical {
            problems.append("\(label) vs \(otherLabel): \(a.canonical) vs \(b.canonical)")
            if problems.count > 5 { break }
        }
        return problems
    }

    /// Per operation: the seqs where it started executing (`isExecuting` → true) and where it
    /// finished (`isFinished` → true), and its queue.
    struct History {
        var queue = ""
        var starts: [Int] = []
        var finishes: [Int] = []
        var cancelled = false
    }

    var histories: [String: History] {
        var h: [String: History] = [:]
        for e in events {
            h[e.operation, default: History()].queue = e.queue
            switch e.key {
            case "isExecuting" where e.isTrue: h[e.operation]?.starts.append(e.seq)
            case "isFinished" where e.isTrue: h[e.operation]?.finishes.append(e.seq)
            case "isCancelled" where e.isTrue: h[e.operation]?.cancelled = true
            default: break
            }
        }
        return h
    }

    /// Replays `isExecuting` per queue: the most operations executing at once in each.
    var peakExecuting: [String: Int] {
        var now: [String: Int] = [:]
        var peak: [String: Int] = [:]
        for e in events where e.key == "isExecuting" {
            if e.isTrue { now[e.queue, default: 0] += 1 } else if e.isFalse { now[e.queue, default: 0] -= 1 }
            peak[e.queue] = max(peak[e.queue] ?? 0, now[e.queue] ?? 0)
        }
        return peak
    }

    /// Every operation in `expected` started exactly once and finished exactly once (and was not
    /// cancelled); every operation in the feed is one of `expected` or `inDoubt`.
    func exactlyOnceProblems(expected: Set<String>, inDoubt: Set<String> = []) -> [String] {
        var problems: [String] = []
        let h = histories
        for id in expected.sorted() {
            guard let o = h[id] else {
                problems.append("\(id): acknowledged, but not in the feed")
                continue
            }
            if o.starts.count != 1 { problems.append("\(id) (\(o.queue)): started \(o.starts.count) times, at seqs \(o.starts)") }
            if o.finishes.count != 1 { problems.append("\(id) (\(o.queue)): finished \(o.finishes.count) times, at seqs \(o.finishes)") }
            if o.cancelled { problems.append("\(id) (\(o.queue)): cancelled, though nobody cancelled it") }
        }
        for id in h.keys.sorted() where !expected.contains(id) && !inDoubt.contains(id) {
            problems.append("\(id) (\(h[id]!.queue)): in the feed but never acknowledged to any client (a duplicate create?)")
        }
        return problems
    }
}
