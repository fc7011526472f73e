-- Outbox table and the connector's user for the docker-compose demo.
CREATE TABLE IF NOT EXISTS shop.outbox_events (
 id CHAR(36) PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL,
 aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL,
 schema_version SMALLINT UNSIGNED NOT NULL, payload JSON NOT NULL, headers JSON NULL,
 occurred_at DATETIME(6) NOT NULL,
 -- The polling relay's columns (source.kind = "poll"); the binlog source reads none of them.
 seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE, published_at DATETIME(6) NULL,
 attempts INT UNSIGNED NOT NULL DEFAULT 0, next_attempt_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
 last_error VARCHAR(1000) NULL,
 KEY idx_unpublished (published_at,seq),
 KEY idx_aggregate (aggregate_type,aggregate_id,occurred_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
-- How far each outbox table is published, for a relay with [poll] progress_table (README, the polling relay).
CREATE TABLE IF NOT EXISTS shop.outbox_relay_progress (
 outbox_table VARCHAR(255) NOT NULL PRIMARY KEY, published_through BIGINT UNSIGNED NOT NULL,
 updated_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;
CREATE USER IF NOT EXISTS 'cdc'@'%' IDENTIFIED BY 'cdc-demo-password';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%';
GRANT SELECT, LOCK TABLES ON shop.* TO 'cdc'@'%';
