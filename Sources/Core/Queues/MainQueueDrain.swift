/// The main queue's one custom source on `ThreadLoop.main`, in the common
/// modes: signalled when the main queue has an item to start, it runs one
/// pass over the items queued when the pass began. A loop run in a mode
/// outside the common set does not drain the main queue (as on every
/// platform that has one).
enum MainQueueDrain {
    private static let source: LoopSource = {
        let source = LoopSource { _ in WorkQueue.main.drainMainPass() }
        ThreadLoop.main.add(source, forMode: .common)
        return source
    }()

    /// Adds the source to the main loop (once).
    static func install() { _ = source }

    /// Asks the main loop for a pass over the main queue; wakes it if it
    /// sleeps. Any thread; never blocks.
    static func signal() { source.signal() }
}
