/// The kernel side of one event source: what it watches, how an event
/// becomes data, and how the watch is re-armed. Each kind has one.
///
/// Calls: `start` once at activation (any thread); `take` and
/// `handlerReturned` on the target, one call at a time (the source never
/// runs two calls at once); `stop` once at cancel (any thread), `finish`
/// once after the cancel handler; `move` from `setTarget`.
protocol SourceWatch: AnyObject, Sendable {
    /// Starts watching at `placement`; events reach `source` through
    /// `add`/`or`/`replace`/`noteEvent`. A watch that cannot be made there
    /// fails the source (`EventSource.fail`).
    func start(for source: EventSource, at placement: WatchPlacement)
    /// The data for the call about to run; nil when there is nothing to
    /// report (the call is then skipped).
    func take(for source: EventSource) -> UInt64?
    /// After an event call returned on a source not cancelled: re-arm a
    /// watch that disarmed itself when it fired.
    func handlerReturned(for source: EventSource)
    /// Moves the watch to another placement (never the same one).
    func move(for source: EventSource, to placement: WatchPlacement)
    /// Stops watching for good.
    func stop()
    /// Releases what the watch owns (after the cancel handler has run).
    func finish()
    /// Where the kernel watch is now ("loop", "pool", "reactor"), nil when
    /// it is nowhere (not started, fired for good, stopped). A test's view.
    var placementName: String? { get }
}

extension SourceWatch {
    func take(for source: EventSource) -> UInt64? { source.nonZero(source.takeAccumulated()) }
    func handlerReturned(for source: EventSource) {}
    func finish() {}
    var placementName: String? { nil }
}
