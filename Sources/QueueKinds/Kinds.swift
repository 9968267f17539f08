import QueueEngine

/// The kinds a server offers, by name.
public func standardKinds(_ configuration: KindsConfiguration = KindsConfiguration()) -> [String: any OperationKind] {
    [
        "delay": DelayKind(),
        "http": HTTPKind(),
        "command": CommandKind(configuration),
        "external": ExternalKind(),
    ]
}

/// What the kinds may do on this server.
public struct KindsConfiguration: Sendable {
    /// Executables `command` operations may run (absolute paths). Empty: the kind is off.
    /// `argv[0]` must equal one of them exactly; symlinks are not resolved on either side, so
    /// allowing `/usr/bin/python3` does not allow `/usr/bin/python3.11` or the other way round.
    public var allowCommands: [String] = []
    /// `command` children running at once; more wait for a slot.
    public var maxCommands: Int = 16
    public init(allowCommands: [String] = [], maxCommands: Int = 16) {
        self.allowCommands = allowCommands
        self.maxCommands = maxCommands
    }
}
