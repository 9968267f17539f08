import Foundation
import Glibc
import Locking
import Testing

@testable import MicroHTTP

@Suite("Request body limit")
struct BodyLimitTests {
    @Test("a declared 20 MiB body is refused with 413 before it is sent, and the server still answers")
    func contentLengthOverLimit() throws {
        try withServer(handler: echoHandler) { server throws in
            let socket = try RawConnection(port: server.port)
            // Only the head: the answer must come without the body being read.
            socket.send("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 20971520\r\n\r\n")
            let response = try socket.readResponse()
            #expect(response.status == 413)
            #expect(response.headers["content-type"] == "application/problem+json")
            #expect(
                response.text
                    == #"{"type":"https://opqd.dev/problems/payload-too-large","title":"Payload Too Large","status":413,"detail":"request body is 20971520 bytes; the limit is 1048576 bytes (--max-body)"}"#
            )
            #expect(try socket.readsEOF(), "MHD closes a connection whose body it skipped")
            #expect(try fetch(port: server.port, "GET", "/after").status == 200)
        }
    }

    @Test("curl posting a 20 MiB file gets 413")
    func curlOverLimit() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("microhttp-20mib-\(getpid())")
        try Data(count: 20 << 20).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        try withServer(handler: echoHandler) { server throws in
            let result = try curl(["--data-binary", "@\(file.path)", "http://127.0.0.1:\(server.port)/big"])
            #expect(result.status == 413)
            #expect(result.body.contains("the limit is 1048576 bytes"))
            #expect(try fetch(port: server.port, "GET", "/after").status == 200)
        }
    }

    @Test("a chunked body over the limit gets 413 and the server still answers")
    func chunkedOverLimit() throws {
        let handled = Lock<Int>(0)
        try withServer(handler: { request in
            handled.withLock { $0 += 1 }
            return try echoHandler(request)
        }) { server throws in
            let socket = try RawConnection(port: server.port)
            socket.send("POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            let chunk = [UInt8](repeating: 0x62, count: 64 * 1024)
            for _ in 0..<32 {  // 2 MiB
                socket.send(Array("10000\r\n".utf8) + chunk + Array("\r\n".utf8))
            }
            socket.send("0\r\n\r\n")
            let response = try socket.readResponse()
            #expect(response.status == 413)
            let problem = try jsonObject(response.body)
            #expect(problem["detail"] as? String == "request body is 2097152 bytes; the limit is 1048576 bytes (--max-body)")
            #expect(try fetch(port: server.port, "GET", "/after").status == 200)
        }
        #expect(handled.withLock { $0 } == 1)
    }

    @Test("a chunked body under the limit is reassembled", arguments: [0, 1, 1000, 1 << 20])
    func chunkedUnderLimit(size: Int) throws {
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        try withServer(handler: { request in .response(HTTPResponse(status: 200, body: request.body)) }) { server throws in
            let socket = try RawConnection(port: server.port)
            socket.send("PUT /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            var offset = 0
            while offset < payload.count {
                let part = Array(payload[offset..<min(payload.count, offset + 10_000)])
                socket.send(Array("\(String(part.count, radix: 16))\r\n".utf8) + part + Array("\r\n".utf8))
                offset += part.count
            }
            socket.send("0\r\n\r\n")
            let response = try socket.readResponse()
            #expect(response.status == 200)
            #expect(response.body == payload)
        }
    }

    @Test("a body of exactly the limit is accepted")
    func exactlyAtLimit() throws {
        try withServer(maxBodyBytes: 1000, handler: echoHandler) { server throws in
            #expect(try fetch(port: server.port, "POST", "/", body: [UInt8](repeating: 1, count: 1000)).status == 200)
            #expect(try fetch(port: server.port, "POST", "/", body: [UInt8](repeating: 1, count: 1001)).status == 413)
        }
    }
}
