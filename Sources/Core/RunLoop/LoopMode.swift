/// A run-loop mode (Foundation's `RunLoop.Mode`): a named set of sources,
/// timers and observers. A loop runs in one mode at a time, and only that
/// mode's items take part; the events of other items are held until a pass in
/// one of their modes.
///
/// Any name makes a mode. `.common` is not a mode one runs in but a set:
/// adding an item to `.common` adds it to every mode in the loop's
/// common-modes set (initially just `.default`; see
/// `ThreadLoop.addCommonMode(_:)`).
public struct LoopMode: Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    /// The mode's name; two modes are the same mode when their names are equal.
    public let name: String

    /// The mode named `name`.
    public init(_ name: String) { self.name = name }
    /// The mode named by a string literal: `let tracking: LoopMode = "tracking"`.
    public init(stringLiteral name: String) { self.name = name }

    /// The mode most code runs in and adds its items to.
    public static let `default` = LoopMode("default")
    /// The placeholder for "every mode in the common-modes set".
    public static let common = LoopMode("common")

    public var description: String { name }
}

/// The points of a pass that observers can watch, in the order a pass
/// reaches them.
public struct LoopActivity: OptionSet, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// The loop was entered (once per `run` call).
    public static let entry = LoopActivity(rawValue: 1 << 0)
    /// Timers that are due are about to fire (every pass).
    public static let beforeTimers = LoopActivity(rawValue: 1 << 1)
    /// Signalled custom sources are about to fire (every pass).
    public static let beforeSources = LoopActivity(rawValue: 1 << 2)
    /// The thread is about to sleep.
    public static let beforeWaiting = LoopActivity(rawValue: 1 << 5)
    /// The thread woke, before it handles what woke it.
    public static let afterWaiting = LoopActivity(rawValue: 1 << 6)
    /// The loop is returning from `run`.
    public static let exit = LoopActivity(rawValue: 1 << 7)
    /// All of the above.
    public static let all: LoopActivity = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting, .exit]

    public var description: String {
        let names: [(LoopActivity, String)] = [
            (.entry, "entry"), (.beforeTimers, "beforeTimers"), (.beforeSources, "beforeSources"),
            (.beforeWaiting, "beforeWaiting"), (.afterWaiting, "afterWaiting"), (.exit, "exit"),
        ]
        return names.filter { contains($0.0) }.map(\.1).joined(separator: "|")
    }
}

/// Why a `run(mode:timeout:returnAfterSourceHandled:)` call returned.
public enum LoopRunResult: Sendable, Hashable {
    /// The mode has no sources, timers or pending performs.
    case finished
    /// `stop()` was called.
    case stopped
    /// The time limit passed.
    case timedOut
    /// A source fired and the run was asked to return after one.
    case handledSource
}
