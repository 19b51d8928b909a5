import CShims

#if canImport(Glibc)
import Glibc
#endif

extension NativeThread {
    /// In a child just forked (see `ForkHandlers`): the one thread left is
    /// the child's main thread, its id the child's pid. Its record from the
    /// parent is dropped from the slots, not released (its teardown would
    /// run the parent thread's exit duties), so its next `current` makes a
    /// fresh one; `NativeThread.main` takes the child's pid.
    static func childAfterFork() {
        main.tid.store(getpid(), ordering: .relaxed)
        if cshims_current_thread() != nil {
            cshims_set_current_thread(nil)
            pthread_setspecific(currentThreadKey, nil)
        }
    }
}
