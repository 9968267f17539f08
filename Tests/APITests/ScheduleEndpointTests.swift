import Foundation
import QueueAPI
import QueueTesting
import Testing

/// Schedules through HTTP (API.md "Schedules").
@Suite("Schedules over HTTP")
struct ScheduleEndpointTests {
    @Test("create, runs at their times with {name, nominalTime}, preview, pause, resume, trigger, backfill, list, delete")
    func lifecycle() async throws {
        try await withLiveServer { server in
            try await server.createQueue("reports", maxConcurrent: 10)
            let made = try await server.request(
                "POST", "/v1/queues/reports/schedules",
                json: #"{"name":"tick","every":1,"operation":{"kind":"delay","spec":{"seconds":0.01}},"overlap":"allow","catchup":{"policy":"skip"}}"#)
            #expect(made.status == 201, "\(made.text)")
            #expect(made.headers["location"] == "/v1/queues/reports/schedules/tick")
            #expect(made.string("nextRunAt") != nil && made.int("runs") == 0 && made.string("timezone") == "UTC")
            #expect(
                try await eventually(timeout: 5) {
                    let ops = try await server.operations(in: "reports")
                    return ops.filter { ($0["schedule"] as? [String: Any])?["name"] as? String == "tick" }.count >= 2
                })
            let ops = try await server.operations(in: "reports")
            let times = ops.compactMap { (($0["schedule"] as? [String: Any])?["nominalTime"] as? String).flatMap(parseTime) }
            #expect(times.count >= 2 && times.allSatisfy { $0.timeIntervalSince1970 == $0.timeIntervalSince1970.rounded() }, "whole seconds: \(times)")
            #expect(Set(times).count == times.count, "each nominal time once")
            let paused = try await server.request("POST", "/v1/queues/reports/schedules/tick/pause", json: #"{"note":"deploy"}"#)
            #expect(paused.object["isPaused"] as? Bool == true && paused.string("pausedNote") == "deploy" && paused.object["nextRunAt"] == nil)
            let count = try await server.operations(in: "reports").count
            try await Task.sleep(nanoseconds: 1_500_000_000)
            #expect(try await server.operations(in: "reports").count == count, "nothing while paused")
            let resumed = try await server.request("POST", "/v1/queues/reports/schedules/tick/resume")
            #expect(resumed.object["isPaused"] as? Bool == false && (resumed.int("skipped") ?? 0) >= 1)
            let trig = try await server.request("POST", "/v1/queues/reports/schedules/tick/trigger")
            #expect(trig.status == 201 && trig.string("admission") == "created" && trig.object["schedule"] != nil, "\(trig.text)")
            // A cron in Berlin: its preview, with the wall clock.
            let berlin = try await server.request(
                "POST", "/v1/queues/reports/schedules",
                json: #"{"name":"nightly","cron":"30 2 * * *","timezone":"Europe/Berlin","operation":{"kind":"delay","spec":{"seconds":1}},"isPaused":true}"#)
            #expect(berlin.status == 201 && berlin.object["isPaused"] as? Bool == true)
            let next = try await server.request("GET", "/v1/queues/reports/schedules/nightly/next?count=3")
            let runs = (next.object["runs"] as? [[String: Any]]) ?? []
            #expect(runs.count == 3 && runs.allSatisfy { ($0["localTime"] as? String)?.contains("T02:30:00+0") == true }, "\(next.text)")
            let filled = try await server.request(
                "POST", "/v1/queues/reports/schedules/nightly/backfill", json: #"{"from":"2026-01-01T00:00:00Z","to":"2026-01-04T00:00:00Z"}"#)
            let chain = (filled.object["operations"] as? [[String: Any]]) ?? []
            #expect(filled.status == 201 && chain.count == 3, "\(filled.text)")
            #expect((chain.last?["dependencies"] as? [String]) == [chain[1]["id"] as? String ?? ""], "a chain by default")
            let all = try await server.request("GET", "/v1/schedules")
            #expect(((all.object["schedules"] as? [[String: Any]]) ?? []).map { $0["name"] as? String } == ["nightly", "tick"])
            expectProblem(try await server.request("DELETE", "/v1/queues/reports"), 409, mentioning: ["schedule"])
            #expect(try await server.request("DELETE", "/v1/queues/reports/schedules/tick").status == 204)
            #expect(try await server.request("GET", "/v1/queues/reports/schedules/tick").status == 404)
            #expect(try await server.request("DELETE", "/v1/queues/reports?force=true").status == 204)
        }
    }

    @Test("refusals name the field and change nothing")
    func refusals() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let op = #""operation":{"kind":"delay","spec":{"seconds":1}}"#
            for (body, field, status) in [
                (#"{"name":"a","cron":"61 * * * *",\#(op)}"#, "cron", 422), (#"{"name":"a","cron":"0 0 30 2 *",\#(op)}"#, "cron", 422),
                (#"{"name":"a","every":5,"cron":"* * * * *",\#(op)}"#, "every", 422), (#"{"name":"a",\#(op)}"#, "cron", 422),
                (#"{"name":"a","every":5,"timezone":"Mars/Olympus",\#(op)}"#, "timezone", 422),
                (#"{"name":"a","every":5,"operation":{"kind":"delay","spec":{"seconds":-1}}}"#, "operation.spec.seconds", 422),
                (#"{"name":"a","every":5,"operation":{"kind":"delay","spec":{"seconds":1},"dependencies":[]}}"#, "operation.dependencies", 422),
                (#"{"name":"a","every":0,\#(op)}"#, "every", 422), (#"{"name":"a","every":5,"overlap":"sometimes",\#(op)}"#, "overlap", 422),
                (#"{"name":"a","every":5,"catchup":{"policy":"often"},\#(op)}"#, "catchup.policy", 422),
                (#"{"name":"a","every":5,"jitter":7200,\#(op)}"#, "jitter", 422),
                (#"{"name":"a b","every":5,\#(op)}"#, "name", 422),
                (#"{"name":"a","every":5,"startAt":"2027-01-02T00:00:00Z","endAt":"2027-01-01T00:00:00Z",\#(op)}"#, "endAt", 422),
                // The template's limits are named where they are in the body.
                (
                    #"{"name":"a","every":5,"operation":{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"L"},{"limiter":"L","key":""}]}}"#,
                    "operation.limits[1]", 422
                ),
                (
                    #"{"name":"a","every":5,"operation":{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"nope"}]}}"#, "operation.limits[0].limiter",
                    422
                ),
            ] {
                expectProblem(try await server.request("POST", "/v1/queues/q/schedules", json: body), status, mentioning: [field])
            }
            #expect((try await server.request("GET", "/v1/queues/q/schedules").object["schedules"] as? [Any])?.isEmpty == true, "nothing was made")
            #expect(try await server.request("POST", "/v1/queues/q/schedules", json: #"{"name":"a","every":5,\#(op)}"#).status == 201)
            expectProblem(try await server.request("POST", "/v1/queues/q/schedules", json: #"{"name":"a","every":5,\#(op)}"#), 409, mentioning: ["a"])
            expectProblem(try await server.request("GET", "/v1/queues/q/schedules/zz"), 404, mentioning: ["zz"])
            expectProblem(try await server.request("GET", "/v1/queues/q/schedules/a/next?count=101"), 422, mentioning: ["count"])
        }
    }
}
