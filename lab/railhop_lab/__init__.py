"""railhop's emulation lab, beside the agent (not inside it): an emulated multi-NIC fabric of
network namespaces (:mod:`~railhop_lab.fabric`), the driver of the plugin's ``railhop-harness``
program (:mod:`~railhop_lab.harness`), fault scenarios and their analysis
(:mod:`~railhop_lab.scenario`), the PNG timeline (:mod:`~railhop_lab.render`) and the demo
(:mod:`~railhop_lab.demo`, ``railhop demo``). Used by the tests, the benchmarks and the demo; a
node runs the agent without it."""
