import Testing

@testable import MicroHTTP

@Suite("No traps on extreme settings and inputs")
struct MicroHTTPTrapTests {
    @Test("a body limit near Int.max does not overflow the discard limit, and bodies still arrive")
    func hugeBodyLimit() throws {
        try withServer(maxBodyBytes: Int.max, handler: echoHandler) { server throws in
            let response = try fetch(port: server.port, "POST", "/echo", body: Array("hello".utf8))
            #expect(response.status == 200)
        }
    }

    @Test("an absurd Content-Length is neither trusted nor trapped on")
    func absurdContentLength() throws {
        try withServer(handler: echoHandler) { server throws in
            for length in ["18446744073709551615", "9223372036854775807", "-1", "1e9"] {
                let socket = try RawConnection(port: server.port, timeout: 2)
                socket.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: \(length)\r\n\r\n")
                _ = try? socket.readResponse()
            }
            #expect(try fetch(port: server.port, "GET", "/after").status == 200)
        }
    }
}
