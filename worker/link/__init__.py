"""The worker's conversation with the scheduler: the `Connect` stream (`client`), the one
translation between wire messages and dataclasses (`wire`), and those dataclasses, a step's
plan and its outcome (`step`)."""
