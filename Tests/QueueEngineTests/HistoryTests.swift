import QueueEngine
import Testing

/// A queue's history in the engine, on a manual clock (API.md "History").
extension Engine {
    @Suite struct History {
        func bucket(_ f: Fixture, _ queue: String? = "q", step: Int64 = 60) throws -> [HistoryBucket] {
            let since = f.clock.now().adding(seconds: -40 * 86_400)
            return try queue.map { try f.engine.history(of: $0, step: step, since: since).buckets } ?? f.engine.historyOfAll(step: step, since: since).buckets
        }

        @Test func countsWaitsAndRunsLandInTheirMinute() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q")
            let b = try f.add("q")
            let c = try f.add("q")
            _ = try f.engine.cancel(c)  // never started
            f.clock.advance(seconds: 2)
            f.kind.finish(a)  // b waited 2 s for the slot
            f.clock.advance(seconds: 4)
            f.kind.finish(b, .failed(type: "boom", detail: "x"))
            let buckets = try bucket(f)
            #expect(buckets.count == 1)
            let m = try #require(buckets.first)
            #expect(m.created == 3 && m.started == 2 && m.succeeded == 1 && m.failed == 1 && m.cancelled == 1)
            #expect(m.start % 60 == 0)
            #expect(m.wait.total == 2 && m.run.total == 2, "a cancelled one that never started has no wait and no run")
            let p95 = try #require(m.wait.quantile(0.95))
            #expect(p95 >= 1 && p95 <= 4, "b's 2 s wait, within a factor of 2: \(p95)")
            let run = try #require(m.run.quantile(0.95))
            #expect(run >= 2 && run <= 8, "b ran 4 s: \(run)")
            // The hour ring has the same.
            let h = try bucket(f, step: 3600)
            #expect(h.count == 1 && h.first?.created == 3 && h.first?.start == m.start - m.start % 3600)
        }

        @Test func eachAttemptIsAStart() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let id = try f.engine.addOperationID(
                to: "q", OperationRequest(kind: "manual", options: OperationOptions(retry: RetryPolicy(maxAttempts: 3, backoff: 1, multiplier: 1))))
            f.kind.finish(id, .failed(type: "boom", detail: "1"))
            f.clock.advance(seconds: 1.1)
            f.kind.finish(id, .failed(type: "boom", detail: "2"))
            f.clock.advance(seconds: 1.1)
            f.kind.finish(id)
            let m = try #require(try bucket(f).first)
            #expect(m.started == 3 && m.succeeded == 1 && m.failed == 0)
        }

        @Test func minutesAndHoursAndFiveMinuteSums() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            // One create a minute for 12 minutes.
            for _ in 0..<12 {
                _ = try f.add("q")
                f.clock.advance(seconds: 60)
            }
            let minutes = try bucket(f)
            #expect(minutes.count == 12 && minutes.allSatisfy { $0.created == 1 })
            #expect(zip(minutes, minutes.dropFirst()).allSatisfy { $1.start - $0.start == 60 }, "oldest first, a minute apart")
            let fives = try bucket(f, step: 300)
            #expect(fives.reduce(0) { $0 + $1.created } == 12 && fives.allSatisfy { $0.start % 300 == 0 } && fives.count >= 3 && fives.count <= 4)
            // `since` cuts the oldest.
            let recent = try f.engine.history(of: "q", step: 60, since: f.clock.now().adding(seconds: -180)).buckets
            #expect(recent.count == 3, "\(recent.map(\.start))")
        }

        @Test func theRingsKeepADayOfMinutesAndThirtyDaysOfHours() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            _ = try f.add("q")
            f.clock.advance(seconds: 86_400 + 120)
            _ = try f.add("q")
            #expect(try bucket(f).count == 1, "yesterday's minute is gone from the minute ring")
            #expect(try bucket(f, step: 3600).count == 2, "the hour ring still has it")
            f.clock.advance(seconds: 31 * 86_400)
            _ = try f.add("q")
            #expect(try bucket(f, step: 3600).count == 1, "30 days on, only the newest hour")
        }

        @Test func historyOfAllIsTheSumAndADeletedQueueLeavesIt() throws {
            let f = Fixture()
            try f.queue("a", max: 100)
            try f.queue("b", max: 100)
            for _ in 0..<3 { _ = try f.add("a") }
            for _ in 0..<2 { _ = try f.add("b") }
            #expect(try bucket(f, nil).first?.created == 5)
            try f.engine.deleteQueue("b", force: true)
            let all = try #require(try bucket(f, nil).first)
            #expect(all.created == 3 && all.cancelled == 0, "b's creates and its cancels at the delete left the sum: \(all)")
        }

        @Test func theSketchIsBoundedAndItsQuantilesInOrder() {
            var s = DurationSketch()
            #expect(s.quantile(0.5) == nil)
            for ms in [0, 1, 3, 10, 100, 1000, 10_000, 100_000, 1_000_000, 100_000_000] as [Int64] { s.add(nanoseconds: ms * 1_000_000) }
            s.add(nanoseconds: -5)
            s.add(nanoseconds: .max)
            #expect(s.counts.count == DurationSketch.bins && s.total == 12)
            let qs = [0.01, 0.25, 0.5, 0.75, 0.95, 1].compactMap { s.quantile($0) }
            #expect(qs.count == 6 && zip(qs, qs.dropFirst()).allSatisfy { $0 <= $1 } && qs.allSatisfy { $0.isFinite && $0 >= 0 })
        }
    }
}
