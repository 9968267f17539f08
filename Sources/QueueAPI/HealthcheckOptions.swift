import Grammar
import OutboundHTTP

/// What `opqd healthcheck [--url U] [--timeout S]` is told: which URL to GET and for how long.
public struct HealthcheckOptions: Sendable, Equatable {
    /// The URL whose 200 means ready; by default this host's `/readyz` on `OPQD_PORT`.
    public var url: String
    /// Seconds the whole exchange may take (connecting included).
    public var timeout: Double = 3
    /// True when `--help` or `-h` was given.
    public var help = false

    /// The longest `--timeout` accepted: a container's health probe that waits longer is a typo.
    public static let maxTimeout: Double = 300

    init(url: String) { self.url = url }

    /// Reads `--url` and `--timeout` (`--flag value` or `--flag=value`); the default URL takes
    /// its port from `OPQD_PORT` (8080 when unset), its host is always 127.0.0.1: in a
    /// container the check runs next to a server listening on 0.0.0.0.
    public static func parse(arguments: [String], environment: [String: String]) throws -> HealthcheckOptions {
        var options = HealthcheckOptions(url: "")
        // As for opqd itself, --help wins over everything else on the line.
        if arguments.contains(where: { $0 == "--help" || $0 == "-h" }) {
            options.help = true
            return options
        }
        var url: String? = nil
        var timeout: Double? = nil
        for (flag, value) in try OpqdConfiguration.flagPairs(arguments, known: { $0 == "--url" || $0 == "--timeout" }) {
            if flag == "--url" { url = value } else { timeout = try seconds(value) }
        }
        if let timeout { options.timeout = timeout }
        if let url {
            if case let .failure(e) = OutboundURL.check(url) { throw ConfigurationError("--url \(e.detail)") }
            options.url = url
        } else {
            options.url = "http://127.0.0.1:\(try defaultPort(environment))/readyz"
        }
        return options
    }

    static func seconds(_ text: String) throws -> Double {
        guard case let .success(s) = DecimalNumber.decimal(text, in: 0...maxTimeout), s > 0 else {
            throw ConfigurationError("--timeout must be a number of seconds above 0 and at most \(Int(maxTimeout)); got '\(text)'")
        }
        return s
    }

    static func defaultPort(_ environment: [String: String]) throws -> Int {
        guard let text = environment["OPQD_PORT"] else { return 8080 }
        guard case let .success(port) = DecimalNumber.integer(text, in: 1...65535) else {
            throw ConfigurationError("OPQD_PORT='\(text)' names no port to check (0 picks a free one); pass --url with the port opqd printed")
        }
        return port
    }

    /// The healthcheck part of `opqd --help`.
    static var help: String {
        """
        opqd healthcheck [--url URL] [--timeout SECONDS]
          GETs the URL once and exits 0 when it answers 200; otherwise exits 1 with one line on
          stderr saying why (connection refused, timeout, the status and the problem's detail),
          or 2 for a bad option. Starts no server and needs no token (/readyz is always open):
          meant for a container's HEALTHCHECK, run in the server's own container.
          --url URL                      default http://127.0.0.1:$OPQD_PORT/readyz (OPQD_PORT default 8080)
          --timeout SECONDS              the whole exchange, connecting included (default 3, at most \(Int(maxTimeout)))
        """
    }
}
