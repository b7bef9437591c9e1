# Future, collect_all, wait_all: written by the Futures work.
