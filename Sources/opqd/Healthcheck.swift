import Dispatch
import Locking
import OpqdApp
import OutboundHTTP
import QueueAPI
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// `opqd healthcheck`: one GET with the outbound client the http kind uses (the image has no
/// curl), then an exit status: 0 when the answer is 200, 1 when it is anything else or none
/// (one line on stderr says why), 2 for a bad option. No logging, no server, no store.
enum Healthcheck {
    static func run(arguments: [String], environment: [String: String]) -> Int32 {
        let options: HealthcheckOptions
        do {
            options = try HealthcheckOptions.parse(arguments: arguments, environment: environment)
        } catch {
            say("opqd healthcheck: \(error)", to: 2)
            return 2
        }
        if options.help {
            print(OpqdConfiguration.help)
            return 0
        }
        // The check is about this host's server: a proxy from the environment must not answer it.
        setenv("NO_PROXY", "*", 1)
        setenv("no_proxy", "*", 1)

        let request = OutboundRequest(
            method: "GET", url: options.url, headers: [("Accept", "application/json, application/problem+json")],
            timeout: options.timeout, connectTimeout: options.timeout, maxResponseBytes: 4096, maxHeaderBytes: 16_384)
        let outcome = Lock<Result<OutboundResponse, OutboundError>?>(nil)
        let answered = DispatchSemaphore(value: 0)
        let client = OutboundHTTPClient()
        client.send(request) { result in
            outcome.withLock { $0 = result }
            answered.signal()
        }
        // The client's deadline ends the exchange; this only bounds a client that never calls back.
        let waited = answered.wait(timeout: .now() + options.timeout + 2)
        switch (waited, outcome.value) {
        case (.success, .success(let response)?) where response.status == 200:
            say("opqd healthcheck: ready (\(quoted(response.finalURL)) answered 200)", to: 1)
            return 0
        case (.success, .success(let response)?):
            say("opqd healthcheck: not ready: \(quoted(response.finalURL)) answered \(response.status)\(reason(response))", to: 2)
            return 1
        case (.success, .failure(let error)?):
            say("opqd healthcheck: not ready: \(error.type): \(oneLine(error.detail))", to: 2)
            return 1
        default:
            say("opqd healthcheck: not ready: no answer from \(quoted(options.url)) within \(options.timeout) s", to: 2)
            return 1
        }
    }

    /// `: <detail>` of a problem+json body (or its title), else nothing.
    static func reason(_ response: OutboundResponse) -> String {
        guard let body = try? JSONValue.parse(response.body) else { return "" }
        for key in ["detail", "title"] {
            if case let .string(text)? = body[key], !text.isEmpty { return ": \(oneLine(text))" }
        }
        return ""
    }

    /// `text` with control characters as spaces and cut to 300 bytes: a reason is one line.
    static func oneLine(_ text: String) -> String {
        let cleaned = String(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? " " : Character($0) })
        return cleaned.utf8.count <= 300 ? cleaned : String(decoding: Array(cleaned.utf8.prefix(300)), as: UTF8.self) + "…"
    }

    static func quoted(_ url: String) -> String { "\"\(oneLine(url))\"" }

    /// Writes `line` and a newline to descriptor `fd` at once.
    static func say(_ line: String, to fd: Int32) {
        let text = line + "\n"
        _ = text.withCString { write(fd, $0, strlen($0)) }
    }
}
