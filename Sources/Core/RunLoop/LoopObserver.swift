/// Watches a loop's passes: its handler runs at each of the chosen
/// activities, on the loop's thread, in `order` among the mode's observers
/// (lower first). A one-shot observer (`repeats: false`) invalidates itself
/// after its first call. Replaces Core Foundation's `CFRunLoopObserver`.
///
/// ```swift
/// let pending = LockedValue<[String]>([])
/// let flush = LoopObserver(activities: .beforeWaiting) { _, _ in
///     // Once per burst of events, just before the loop sleeps.
///     let lines = pending.withLock { lines in defer { lines.removeAll() }; return lines }
///     for line in lines { print(line) }
/// }
/// loop.add(flush, forMode: .common)
/// ```
///
/// Thread-safe: `invalidate()` may be called from any thread; once it
/// returns the handler is not called again (unless it is running right now
/// on the loop thread).
///
/// The handler is `@Sendable`: an observer may be added to loops of several
/// threads, which then call it at once, so the compiler rejects a handler
/// that captures a local `var` or a non-`Sendable` object. Keep changing
/// state in a `Sendable` value such as `LockedValue`.
public final class LoopObserver: @unchecked Sendable {
    // @unchecked: the handler is immutable and `@Sendable`; `isValid` is an
    // atomic word.

    /// The points of a pass at which the handler runs.
    public let activities: LoopActivity
    /// False for a one-shot observer, invalidated after its first call.
    public let repeats: Bool
    /// Position among a mode's observers: lower runs first.
    public let order: Int
    let handler: @Sendable (LoopObserver, LoopActivity) -> Void
    private let valid = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)

    /// An observer of `activities`. The handler receives the observer and
    /// the activity being reached; it runs on the loop's thread and may add
    /// or remove loop items, run the loop (nested) or invalidate itself.
    /// `@Sendable`: several loops' threads may call it at once.
    public init(
        activities: LoopActivity, repeats: Bool = true, order: Int = 0,
        _ handler: @escaping @Sendable (LoopObserver, LoopActivity) -> Void
    ) {
        require(!activities.isEmpty, "LoopObserver.init: `activities` is empty; the observer would never fire")
        self.activities = activities
        self.repeats = repeats
        self.order = order
        self.handler = handler
        valid.initialize(to: 1)
    }

    deinit { valid.deallocate() }

    /// Whether the observer can still fire.
    public var isValid: Bool { AtomicMemory.load(from: valid, ordering: .acquiring) != 0 }

    /// Stops the observer for good. Any thread. Its loops drop it the next
    /// time they notify a mode that holds it, or when their thread exits;
    /// until then they keep it, and what its handler captures, alive (a mode
    /// that never runs again keeps it until `remove(_:forMode:)`).
    public func invalidate() {
        AtomicMemory.store(0, to: valid, ordering: .releasing)
    }
}
