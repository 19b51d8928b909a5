import Synchronization

/// The main queue's one custom source on `ThreadLoop.main`, in the common
/// modes: signalled when the main queue has an item to start, it runs one
/// pass over the items queued when the pass began. A loop run in a mode
/// outside the common set does not drain the main queue (as on every
/// platform that has one).
enum MainQueueDrain {
    private static let source = LoopSource { _ in WorkQueue.main.drainMainPass() }

    /// The main loop the source was added to. A child after `fork()` has a
    /// new main loop, which gets the source the first time it is needed.
    private static let installedOn = Mutex<ObjectIdentifier?>(nil)

    /// Adds the source to the main loop, once per main loop.
    static func install() {
        let loop = ThreadLoop.main
        let identity = ObjectIdentifier(loop)
        let needed = installedOn.withLock { installed in
            if installed == identity { return false }
            installed = identity
            return true
        }
        if needed { loop.add(source, forMode: .common) }
    }

    /// Asks the main loop for a pass over the main queue; wakes it if it
    /// sleeps. Any thread; never blocks (beyond short locks).
    static func signal() {
        install()
        source.signal()
    }
}
