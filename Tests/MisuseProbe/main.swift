// Misuse that only a program's own main thread can commit, for the unit
// tests to run as a child process: an exit test's child runs its body on a
// dispatch worker (its main thread is parked in dispatch_main()), so it
// cannot reach these.
//
//   MisuseProbe sync-main-from-main        WorkQueue.main.sync on the main thread
//   MisuseProbe sync-main-chain-from-main  sync, on the main thread, onto a
//                                          queue that targets the main queue
//   MisuseProbe apply-main-chain-from-main the same with apply
import Spindle

#if canImport(Glibc)
import Glibc
#endif

let arguments = CommandLine.arguments.dropFirst()
switch arguments.first {
case "sync-main-from-main":
    precondition(NativeThread.isMainThread, "MisuseProbe: not on the main thread")
    WorkQueue.main.sync {}
    print("MisuseProbe: WorkQueue.main.sync returned on the main thread")
    exit(0)
case "sync-main-chain-from-main":
    precondition(NativeThread.isMainThread, "MisuseProbe: not on the main thread")
    let queue = WorkQueue(label: "probe.onMain", target: .main)
    queue.sync {}
    print("MisuseProbe: sync onto a queue targeting the main queue returned on the main thread")
    exit(0)
case "apply-main-chain-from-main":
    precondition(NativeThread.isMainThread, "MisuseProbe: not on the main thread")
    let queue = WorkQueue(label: "probe.onMain", kind: .concurrent, target: .main)
    queue.apply(iterations: 4) { _ in }
    print("MisuseProbe: apply onto a queue targeting the main queue returned on the main thread")
    exit(0)
default:
    let usage = "usage: MisuseProbe sync-main-from-main | sync-main-chain-from-main | apply-main-chain-from-main\n"
    _ = write(2, usage, usage.utf8.count)
    exit(64)
}
