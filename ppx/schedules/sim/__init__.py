"""The simulator and what it needs: `costs`, the integer form of a program (`compiled`), the
event-driven core (`simcore`), the transports' rules (`transports`), deadlock reports
(`deadlock`), `simulate` (a `Timeline` from a schedule and costs) and `memory` (a schedule's
predicted activation memory). Imports only the rooms below it."""
