#!lua
-- Saves a chat record, keeping the first created_at.
-- KEYS[1] chat hash   KEYS[2] chat index (zset, score 0: ordered by key)
-- ARGV: key, provider, chat, participant, created_at, last_message_at, data
-- Returns 1. Cost: O(log n) in the index.
redis.call('HSETNX', KEYS[1], 'created_at', ARGV[5])
redis.call('HSET', KEYS[1], 'key', ARGV[1], 'provider', ARGV[2], 'chat', ARGV[3],
           'participant', ARGV[4], 'last_message_at', ARGV[6], 'data', ARGV[7])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
