import Foundation
import QueueEngine
import QueueKinds
import Testing

extension KindsTests {
    /// `http` through a real engine against a local target server.
    @Suite struct HTTP {
        func get(_ url: String, _ extra: String = "") -> String {
            #"{"method": "GET", "url": "\#(url)"\#(extra)}"#
        }

        @Test func okAnswerIsTheResult() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let op = try Harness().run("http", get("\(server.base)/ok"))
            #expect(op.outcome == .succeeded)
            let r = try #require(op.result)
            #expect(r["status"]?.int == 200)
            #expect(r["body"]?.string == "hello")
            #expect(r["bodyEncoding"]?.string == "utf8")
            #expect(r["size"]?.int == 5)
            #expect(r["truncated"]?.bool == false)
            #expect(r["headers"]?["X-Test"]?.string == "yes")
        }

        @Test func statusOutsideExpectStatusFails() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let failed = try h.run("http", get("\(server.base)/status/500"))
            #expect(failed.outcome == .failed)
            #expect(failed.errorType == "http-status")
            #expect(failed.errorData?["status"]?.int == 500)
            #expect(failed.errorData?["body"]?.string == "status 500")

            let expected = try h.run("http", get("\(server.base)/status/404", #", "expectStatus": [404, "5xx"]"#))
            #expect(expected.outcome == .succeeded)
            #expect(expected.result?["status"]?.int == 404)
            let unexpected = try h.run("http", get("\(server.base)/ok", #", "expectStatus": ["4xx"]"#))
            #expect(unexpected.errorType == "http-status")
            #expect(unexpected.errorData?["status"]?.int == 200)
        }

        @Test func largeBodyIsCappedAndBinaryIsBase64() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let large = try h.run("http", get("\(server.base)/large"))
            #expect(large.outcome == .succeeded)
            #expect(large.result?["size"]?.int == 1 << 20)
            #expect(large.result?["truncated"]?.bool == true)
            #expect(large.result?["body"]?.string?.utf8.count == HTTPKind.bodyCap)
            let binary = try h.run("http", get("\(server.base)/binary"))
            #expect(binary.result?["bodyEncoding"]?.string == "base64")
            #expect(binary.result?["body"]?.string.flatMap { Data(base64Encoded: $0) } == Data(repeating: 0xFF, count: 1000))
        }

        @Test func redirectsAreFollowed() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let op = try Harness().run("http", get("\(server.base)/redirect"))
            #expect(op.outcome == .succeeded)
            #expect(op.result?["status"]?.int == 200)
            #expect(op.result?["body"]?.string == "hello")
            #expect(server.count("/redirect") == 1 && server.count("/ok") == 1)
        }

        /// FoundationNetworking trapped (`fatalError("Invalid URL")`) on this redirect.
        @Test func redirectToSchemeRelativeIPv6EndsCleanly() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let op = try Harness().run("http", get("\(server.base)/v6", #", "timeout": 3"#))
            #expect(op.outcome == .failed)
            #expect(["connection-refused", "network", "timeout"].contains(op.errorType ?? ""), "\(op.error?.text ?? "")")
        }

        @Test func redirectLoopAndOtherSchemesFail() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            #expect(try h.run("http", get("\(server.base)/loop")).errorType == "too-many-redirects")
            #expect(server.count("/loop") == HTTPKind.maxRedirects + 1)
            #expect(try h.run("http", get("\(server.base)/to-file")).errorType == "redirect-refused")
        }

        @Test func bodiesAreSentAsTextOrJSON() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let json = try h.run("http", #"{"method": "POST", "url": "\#(server.base)/echo", "body": {"a": [1, true]}}"#)
            #expect(json.result?["body"]?.string == #"{"a":[1,true]}"#)
            #expect(json.result?["headers"]?["X-Got-Content-Type"]?.string == "application/json")
            #expect(json.result?["headers"]?["X-Got-Method"]?.string == "POST")
            let text = try h.run("http", #"{"method": "PUT", "url": "\#(server.base)/echo", "body": "héllo", "headers": {"Content-Type": "text/x-test"}}"#)
            #expect(text.result?["body"]?.string == "héllo")
            #expect(text.result?["headers"]?["X-Got-Content-Type"]?.string == "text/x-test")
            let head = try h.run("http", #"{"method": "HEAD", "url": "\#(server.base)/ok"}"#)
            #expect(head.outcome == .succeeded)
            #expect(head.result?["body"]?.string == "")
        }

        @Test func transportFailuresHaveTheirOwnTypes() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let refused = try h.run("http", get("http://127.0.0.1:\(closedPort())/"))
            #expect(refused.errorType == "connection-refused")
            let dns = try h.run("http", get("http://nonexistent.invalid/"))
            #expect(dns.errorType == "dns")
            let tls = try h.run("http", get("https://127.0.0.1:\(server.port)/ok"))
            #expect(tls.errorType == "tls")
        }

        @Test func specTimeoutFailsTheRequest() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let t0 = now()
            let op = try Harness().run("http", get("\(server.base)/slow", #", "timeout": 0.3"#))
            let took = now() - t0
            #expect(op.errorType == "timeout")
            #expect(took >= 0.29 && took < 1.5, "took \(took) s")
        }

        @Test func cancelAbortsTheRequestQuickly() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let id = try h.add("http", get("\(server.base)/slow"))
            #expect(waitUntil { server.count("/slow") == 1 })
            let t0 = now()
            try h.engine.cancel(id)
            let op = try h.wait(id)
            let latency = (now() - t0) * 1000
            print("http cancel latency: \(String(format: "%.2f", latency)) ms")
            #expect(op.outcome == .cancelled)
            #expect(latency < 200, "cancel took \(latency) ms")
        }

        @Test func pauseAbortsAndResumeSendsAgain() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let id = try h.add("http", get("\(server.base)/slow"))
            #expect(waitUntil { server.count("/slow") == 1 })
            try h.engine.pause(id)
            usleep(200_000)
            #expect(try h.state(id) == .paused)
            try h.engine.resume(id)
            #expect(waitUntil { server.count("/slow") == 2 })
            let op = try h.wait(id)
            #expect(op.outcome == .succeeded)
            #expect(op.result?["body"]?.string == "slow")
            #expect(server.count("/slow") == 2)
        }

        @Test func invalidSpecsAreRefusedNamingTheField() throws {
            let h = try Harness()
            let cases: [(String, String)] = [
                ("{}", "spec.method"),
                (#"{"method": "GET"}"#, "spec.url"),
                (#"{"method": "get", "url": "http://x/"}"#, "spec.method"),
                (#"{"method": "TRACE", "url": "http://x/"}"#, "spec.method"),
                (#"{"method": "GET", "url": "ftp://x/"}"#, "spec.url"),
                (#"{"method": "GET", "url": "/relative"}"#, "spec.url"),
                (#"{"method": "GET", "url": "http://x/", "headers": {"A": 1}}"#, "spec.headers.A"),
                (#"{"method": "GET", "url": "http://x/", "headers": {"A": "x\ny"}}"#, "spec.headers.A"),
                (#"{"method": "GET", "url": "http://x/", "headers": []}"#, "spec.headers"),
                (#"{"method": "GET", "url": "http://x/", "body": "x"}"#, "spec.body"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": [99]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": [200, "6xx"]}"#, "spec.expectStatus[1]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": []}"#, "spec.expectStatus"),
                // Passed a Character check before, then `Int(...)!` trapped on the combining accent.
                (#"{"method": "GET", "url": "http://x/", "expectStatus": ["1\u0301xx"]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": ["\u0662xx", "2XX"]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": [200.5]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": [1e300]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x/", "expectStatus": ["2xxx"]}"#, "spec.expectStatus[0]"),
                (#"{"method": "GET", "url": "http://x y/"}"#, "spec.url"),
                (#"{"method": "GET", "url": "http:///"}"#, "spec.url"),
                (#"{"method": "GET", "url": "http://x/", "timeout": 0.05}"#, "spec.timeout"),
                (#"{"method": "GET", "url": "http://x/", "timeout": 3601}"#, "spec.timeout"),
                (#"{"method": "GET", "url": "http://x/", "retries": 3}"#, "spec.retries"),
                ("[1]", "spec"),
            ]
            for (spec, field) in cases {
                #expect(try h.refusal("http", spec) == field, "\(spec)")
            }
            #expect(
                try h.refusal(
                    "http",
                    #"{"method": "POST", "url": "https://example.com/a?b=c", "headers": {"X-A": "b"}, "body": [1], "expectStatus": [201, "3xx"], "timeout": 0.1}"#
                ) == nil)
        }
    }
}
