-- obx outbox schema, version 5 (PostgreSQL): the inbox as SQL functions, for consumers in any
-- language (docs/inbox-sql.md). Applied after version 4 by pg_store.c's migrate, in the same
-- transaction, under the init advisory lock. No table changes; one constraint trigger is added
-- to obx_inbox. Self-contained: nothing of versions 1-4 is redefined here.
--
-- The consume receipt is version 4's obx_inbox row, evidence columns included: when the
-- delivery's headers carry a well-formed obx-attempt-id and obx-dest-digest (and the envelope
-- generation is 1 or more), inbox_receive() stores them with the generation in envelope_gen,
-- attempt_id and dest_digest, exactly as obx_inbox_process() does, so that the reconciler
-- accepts a delivery recorded here as a critical consumer's evidence (src/engine/resolve.c).
--
-- A consumer calls them inside its own transaction, on its own connection, around its effect:
--
--   BEGIN;
--   SELECT * FROM obx.inbox_receive(consumer, event_id, envelope_gen, payload_digest, topic,
--                                   partition, offset, payload, event_type, tenant, ...);
--     'process'     -> make the effect on this connection, then
--                      SELECT obx.inbox_applied(consumer, event_id, result);
--     'duplicate'   -> nothing to do (result: the first delivery's result)
--     'quarantined' -> same event ID, other payload digest: nothing to do (recorded)
--     'poisoned'    -> refused before any effect (bad event ID, malformed field, payload not
--                      matching its digest, contract or tenant not accepted): parked, visible
--   COMMIT;                          -- then acknowledge the broker, never before
--   on a handler error: ROLLBACK; then in a transaction of its own
--   SELECT * FROM obx.inbox_failed(consumer, event_id, error, max_failures, ...delivery...);
--     'retry' -> do not acknowledge (redelivered);  'poisoned' -> parked: acknowledge
--
-- The semantics are obx_inbox_process()'s (src/engine/inbox.c), row for row: the same consume
-- receipt, watermark, failure count, poison row, quarantine row and consume audit rows with
-- the same outcomes and messages, so that `obx poison`, `obx status`, the metrics, the audit
-- and retention see a consumer written in Python or JavaScript exactly as one written in C.
-- tests/store/test_inbox_sql.c runs both inboxes on the same cases and compares the rows.
--
-- Privileges: every function is SECURITY INVOKER. A role can do through them exactly what its
-- own grants and row-level security allow on the inbox tables, and nothing else: the
-- <prefix>_consumer role of obx.create_roles() (version 1) is the least-privilege consumer
-- role, restricted to the consumer IDs and tenants obx.obx_consumer_grant lists for it, with
-- no access to the outbox. EXECUTE stays with PUBLIC for that reason (a role without inbox
-- grants gets "permission denied" from the first statement).

-- Milliseconds and microseconds since the epoch, from the clock (not the transaction start:
-- a consumer transaction may be long).
CREATE FUNCTION obx._inbox_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;
CREATE FUNCTION obx._inbox_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- Outside text stored in a text column, as obx__text_copy does: control characters become
-- '?', at most max_bytes bytes, never cut inside a character.
CREATE FUNCTION obx._inbox_text(t text, max_bytes integer) RETURNS text LANGUAGE plpgsql
IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s text := regexp_replace(coalesce(t, ''), '[\x01-\x1f\x7f]', '?', 'g');
BEGIN
    IF octet_length(s) <= max_bytes THEN
        RETURN s;
    END IF;
    s := left(s, max_bytes);
    WHILE octet_length(s) > max_bytes LOOP
        s := left(s, length(s) - 1);
    END LOOP;
    RETURN s;
END $$;

-- "fx-" + 64 hex: the same stable key as obx_inbox_effect_key() (SHA-256 over the length-
-- prefixed "obx.effect.v1", consumer, event ID and effect name): the idempotency key of an
-- external call (a payment, an e-mail) made for this event by this consumer.
CREATE FUNCTION obx.inbox_effect_key(consumer_id text, event_id text, effect text DEFAULT 'effect')
RETURNS text LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'fx-' || encode(sha256(
        int4send(octet_length('obx.effect.v1')) || convert_to('obx.effect.v1', 'UTF8') ||
        int4send(octet_length(consumer_id)) || convert_to(consumer_id, 'UTF8') ||
        int4send(octet_length(event_id)) || convert_to(event_id, 'UTF8') ||
        int4send(octet_length(effect)) || convert_to(effect, 'UTF8')), 'hex')
$$;

-- The key a message is parked under: its event ID, or for an unusable one "bad-" and 26 hex
-- digits of SHA-256 over the length-prefixed raw ID and the payload (as inbox.c's poison_key).
CREATE FUNCTION obx._inbox_key(event_id text, payload bytea) RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN event_id ~ '^evt-[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN event_id
           ELSE 'bad-' || left(encode(sha256(int4send(octet_length(coalesce(event_id, '')))
                || convert_to(coalesce(event_id, ''), 'UTF8') || coalesce(payload, '')), 'hex'), 26)
           END
$$;

CREATE FUNCTION obx._inbox_audit(consumer text, key text, outcome text, duration_us bigint,
                                 detail text, at_ms bigint) RETURNS void LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO obx.obx_consume_audit (at, consumer_id, event_id, outcome, duration_us, detail)
    VALUES (at_ms, consumer, key, outcome, duration_us, obx._inbox_text(detail, 255))
$$;

-- The poison row's headers, as inbox.c's headers_of writes them (obx poison list, re-drive).
CREATE FUNCTION obx._inbox_headers(event_id text, envelope_gen integer, payload_digest text,
                                   event_type text, tenant text, headers jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    agg text := headers ->> 'obx-aggregate';
    a_type text;
    a_id text;
    a_ver bigint := 0;
BEGIN
    IF agg ~ '^[^/]+/.+@[0-9]{1,18}$' THEN
        a_type := split_part(agg, '/', 1);
        a_id := substr(agg, length(a_type) + 2);
        a_ver := substring(a_id FROM '@([0-9]+)$')::bigint;
        a_id := left(a_id, length(a_id) - length(substring(a_id FROM '@[0-9]+$')));
    END IF;
    -- absent fields are JSON nulls, as jansson's "o*" writes them in headers_of
    RETURN (jsonb_build_object(
        'event_id', event_id, 'envelope_gen', coalesce(envelope_gen, 0),
        'event_type', event_type, 'tenant', tenant, 'aggregate_type', a_type,
        'aggregate_id', a_id, 'aggregate_version', a_ver,
        'correlation_id', headers ->> 'obx-correlation-id',
        'causation_id', headers ->> 'obx-causation-id',
        'traceparent', headers ->> 'traceparent',
        'occurred_at', CASE WHEN headers ->> 'obx-occurred-at' ~ '^[0-9]{1,15}$'
                            THEN (headers ->> 'obx-occurred-at')::bigint ELSE 0 END,
        'payload_digest', payload_digest)
        -- as headers_of: present only when the message carried them
        || CASE WHEN headers ? 'obx-attempt-id'
                THEN jsonb_build_object('attempt_id', headers ->> 'obx-attempt-id')
                ELSE '{}'::jsonb END
        || CASE WHEN headers ? 'obx-dest-digest'
                THEN jsonb_build_object('dest_digest', headers ->> 'obx-dest-digest')
                ELSE '{}'::jsonb END)::text;
END $$;

-- Parks a message as poison (the upsert and audit row of inbox.c's park).
CREATE FUNCTION obx._inbox_park(consumer text, key text, failures integer, why text, topic text,
                                "partition" integer, "offset" bigint, headers text,
                                payload bytea, at_ms bigint) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_poison AS p (consumer_id, event_id, state, failures, last_error, topic,
        partition, "offset", headers, payload, parked_at, updated_at)
    VALUES (consumer, key, 'PARKED', failures, obx._inbox_text(why, 255),
        obx._inbox_text(topic, 249), coalesce("partition", 0), coalesce("offset", 0), headers,
        payload, at_ms, at_ms)
    ON CONFLICT (consumer_id, event_id) DO UPDATE SET state = EXCLUDED.state,
        failures = EXCLUDED.failures, last_error = EXCLUDED.last_error,
        updated_at = EXCLUDED.updated_at;
    PERFORM obx._inbox_audit(consumer, key, 'POISONED', 0, why, at_ms);
END $$;

-- The validation of inbox.c's step 1, before any effect: NULL when the message may be
-- processed, else why it is parked. Field rules are obx._check's (version 1), with its
-- messages.
CREATE FUNCTION obx._inbox_refusal(consumer text, event_id text, envelope_gen integer,
                                   payload_digest text, topic text, payload bytea,
                                   event_type text, tenant text, accepted_types text[],
                                   accepted_tenants text[], headers jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    agg text := headers ->> 'obx-aggregate';
    digest text;
BEGIN
    IF event_id IS NULL THEN
        RETURN 'bad event ID: event_id: missing';
    ELSIF left(event_id, 4) <> 'evt-' THEN
        RETURN format('bad event ID: event_id: ''%s'' does not start with ''evt-''', left(event_id, 40));
    ELSIF octet_length(event_id) <> 30 THEN
        RETURN format('bad event ID: event_id: ''%s'' is %s bytes, expected 30', left(event_id, 40),
                      octet_length(event_id));
    ELSIF event_id !~ '^evt-[0-9A-HJKMNP-TV-Z]{26}$' THEN
        RETURN format('bad event ID: event_id: ''%s'' has a byte outside the ULID alphabet', event_id);
    ELSIF event_id !~ '^evt-[0-7]' THEN
        RETURN format('bad event ID: event_id: ''%s'' time overflows', event_id);
    END IF;
    BEGIN
        IF envelope_gen IS NULL OR envelope_gen < 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('envelope_gen: %s is not 1 or more', coalesce(envelope_gen::text, 'missing'));
        END IF;
        PERFORM obx._check('event_type', event_type, 1, 128, 'event_type');
        PERFORM obx._check('tenant', tenant, 1, 128, 'name');
        IF agg IS NOT NULL AND agg !~ '^[A-Za-z0-9._-]{1,128}/[^\x01-\x1f\x7f]{1,255}@[0-9]{1,18}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('obx-aggregate: ''%s'' is not type/id@version', left(agg, 80));
        END IF;
        PERFORM obx._check('correlation_id', headers ->> 'obx-correlation-id', 0, 255, 'text');
        PERFORM obx._check('causation_id', headers ->> 'obx-causation-id', 0, 255, 'text');
        PERFORM obx._check('traceparent', headers ->> 'traceparent', 0, 55, 'name');
        PERFORM obx._check('topic', topic, 0, 249, 'name');
        IF payload IS NULL OR octet_length(payload) = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = 'payload: empty (an obx event carries 1 byte or more)';
        END IF;
    EXCEPTION WHEN SQLSTATE 'OB002' OR SQLSTATE 'OB003' THEN
        RETURN 'malformed message: ' || SQLERRM;
    END;
    digest := 'sha256:' || encode(sha256(payload), 'hex');
    IF payload_digest IS DISTINCT FROM digest THEN
        RETURN format('payload does not match its digest header (%s)',
                      coalesce(left(regexp_replace(payload_digest, '[\x01-\x1f\x7f]', '?', 'g'), 24), '(none)'));
    END IF;
    IF cardinality(accepted_types) > 0 AND NOT event_type = ANY (accepted_types) THEN
        RETURN format('contract ''%s'' is not accepted by consumer %s', event_type, consumer);
    END IF;
    IF cardinality(accepted_tenants) > 0 AND NOT tenant = ANY (accepted_tenants) THEN
        RETURN format('tenant ''%s'' is not served by consumer %s', tenant, consumer);
    END IF;
    RETURN NULL;
END $$;

-- Records a delivery and decides. With 'process' the consume receipt is inserted now (its
-- unique key makes a concurrent instance delivering the same event wait for this transaction,
-- then answer 'duplicate'), the watermark moves, and obx.inbox_applied() must complete the
-- receipt before COMMIT: a transaction that tries to commit a receipt it never completed fails
-- (constraint trigger below), so a forgotten call cannot record an effect that was not made.
-- consumer_id: [A-Za-z0-9._-]{1,128}. accepted_types / accepted_tenants: the contracts and
-- tenants the consumer declares (NULL or empty: any), as obx_inbox_options. headers: the obx
-- message headers as delivered (name -> value: obx-aggregate, obx-correlation-id,
-- obx-causation-id, traceparent, obx-occurred-at, obx-attempt-id, obx-dest-digest), optional;
-- pass every header the message carries: the attempt and destination digest make the receipt
-- evidence for the reconciler.
CREATE FUNCTION obx.inbox_receive(consumer_id text, event_id text, envelope_gen integer,
                                  payload_digest text, topic text, "partition" integer,
                                  "offset" bigint, payload bytea, event_type text, tenant text,
                                  accepted_types text[] DEFAULT NULL,
                                  accepted_tenants text[] DEFAULT NULL,
                                  headers jsonb DEFAULT NULL)
RETURNS TABLE (decision text, result text, detail text) LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    why text;
    prev record;
    hj text;
    digest text;
    occurred bigint := 0;
    ev_gen integer := 0;
    ev_attempt text := '';
    ev_dest text := '';
BEGIN
    PERFORM obx._check('consumer_id', consumer_id, 1, 128, 'name');
    hj := obx._inbox_headers(event_id, envelope_gen, payload_digest, event_type, tenant, headers);
    why := obx._inbox_refusal(consumer_id, event_id, envelope_gen, payload_digest, topic, payload,
                              event_type, tenant, accepted_types, accepted_tenants, headers);
    IF why IS NOT NULL THEN
        PERFORM obx._inbox_park(consumer_id, obx._inbox_key(event_id, payload), 0, why, topic,
                                "partition", "offset", hj, payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, ''::text, why;
        RETURN;
    END IF;
    digest := payload_digest; -- checked against the payload above
    IF headers ->> 'obx-occurred-at' ~ '^[0-9]{1,15}$' THEN
        occurred := (headers ->> 'obx-occurred-at')::bigint;
    END IF;
    -- evidence for the reconciler only when well-formed (outside input), as inbox.c: otherwise
    -- the row is an ordinary consume receipt (0 / '' / '')
    IF envelope_gen > 0
       AND headers ->> 'obx-attempt-id' ~ '^att-[0-9A-HJKMNP-TV-Z]{26}$'
       AND headers ->> 'obx-dest-digest' ~ '^sha256:[0-9a-f]{64}$' THEN
        ev_gen := envelope_gen;
        ev_attempt := headers ->> 'obx-attempt-id';
        ev_dest := headers ->> 'obx-dest-digest';
    END IF;
    -- a message this consumer already parked comes again when the ack of its 'poisoned' was
    -- lost: it stays parked, the handler does not run, nothing is written (as inbox.c); only a
    -- re-drive (state REDRIVE) runs it again
    SELECT p.failures, p.last_error INTO prev FROM obx.obx_poison p
     WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'PARKED';
    IF FOUND THEN
        RETURN QUERY SELECT 'poisoned'::text, ''::text,
            'already parked: ' || left(prev.last_error, 200);
        RETURN;
    END IF;
    -- the receipt, or the one already there (a committed one, or one whose transaction this
    -- insert waited for). The placeholder duration is minus the receive time in microseconds;
    -- inbox_applied() turns it into the handler's run time.
    BEGIN
        INSERT INTO obx.obx_inbox AS i (consumer_id, event_id, payload_digest, event_type, tenant,
            outcome, result, topic, partition, "offset", consumed_at, duration_us, envelope_gen,
            attempt_id, dest_digest)
        VALUES (consumer_id, event_id, digest, event_type, tenant, 'RECEIVED', '',
            coalesce(topic, ''), coalesce("partition", 0), coalesce("offset", 0), now_ms,
            -obx._inbox_us(), ev_gen, ev_attempt, ev_dest)
        ON CONFLICT ON CONSTRAINT obx_inbox_pkey DO NOTHING;
    EXCEPTION WHEN insufficient_privilege THEN
        -- row-level security refused this consumer's receipt (the role is not granted this
        -- consumer ID or tenant): park the message, visible, instead of stalling on it
        why := format('the consumer''s database refused the receipt: %s', SQLERRM);
        PERFORM obx._inbox_park(consumer_id, event_id, 0, why, topic, "partition", "offset", hj,
                                payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, ''::text, why;
        RETURN;
    END;
    IF FOUND THEN
        INSERT INTO obx.obx_consumer_watermark AS w (consumer_id, topic, partition, "offset",
            event_id, occurred_at, committed_at)
        VALUES (consumer_id, coalesce(topic, ''), coalesce("partition", 0), coalesce("offset", 0),
            event_id, occurred, now_ms)
        ON CONFLICT ON CONSTRAINT obx_consumer_watermark_pkey DO UPDATE SET
            event_id = CASE WHEN EXCLUDED."offset" >= w."offset" THEN EXCLUDED.event_id
                       ELSE w.event_id END,
            occurred_at = CASE WHEN EXCLUDED."offset" >= w."offset" THEN EXCLUDED.occurred_at
                          ELSE w.occurred_at END,
            "offset" = greatest(w."offset", EXCLUDED."offset"),
            committed_at = EXCLUDED.committed_at;
        RETURN QUERY SELECT 'process'::text, ''::text, ''::text;
        RETURN;
    END IF;
    SELECT i.payload_digest, i.outcome, i.result, i.consumed_at, i."offset" INTO prev
      FROM obx.obx_inbox i WHERE i.consumer_id = consumer_id AND i.event_id = event_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'inbox: a consume receipt of %s for consumer %s exists but is not visible to this '
            'database role (row-level security?)', event_id, consumer_id);
    END IF;
    IF prev.outcome = 'RECEIVED' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox: %s was already received by consumer %s in this transaction', event_id,
            consumer_id);
    END IF;
    IF prev.payload_digest = digest THEN
        why := format('already applied at %s (offset %s)', prev.consumed_at, prev."offset");
        PERFORM obx._inbox_audit(consumer_id, event_id, 'DUPLICATE', 0, why, now_ms);
        -- a re-driven poison message that had been applied meanwhile is done
        UPDATE obx.obx_poison p SET state = 'DONE', updated_at = now_ms
         WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'REDRIVE';
        RETURN QUERY SELECT 'duplicate'::text, prev.result, why;
        RETURN;
    END IF;
    why := format('same event ID, different payload digest (first %s..., now %s...)',
                  left(prev.payload_digest, 20), left(digest, 20));
    INSERT INTO obx.obx_inbox_quarantine (consumer_id, event_id, payload_digest, first_digest,
        reason, at)
    VALUES (consumer_id, event_id, digest, prev.payload_digest, why, now_ms);
    PERFORM obx._inbox_audit(consumer_id, event_id, 'QUARANTINED', 0, why, now_ms);
    RETURN QUERY SELECT 'quarantined'::text, ''::text, why;
END $$;

-- Completes the receipt obx.inbox_receive() inserted in this transaction with the handler's
-- result (up to 255 bytes of text): APPLIED, the failure count cleared, a re-driven poison
-- message done, the consume audit row with the handler's run time.
CREATE FUNCTION obx.inbox_applied(consumer_id text, event_id text, result text DEFAULT '')
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    res text := obx._inbox_text(result, 255);
    dur bigint;
BEGIN
    UPDATE obx.obx_inbox i SET outcome = 'APPLIED', result = res,
           duration_us = greatest(obx._inbox_us() + i.duration_us, 0)
     WHERE i.consumer_id = consumer_id AND i.event_id = event_id AND i.outcome = 'RECEIVED'
    RETURNING i.duration_us INTO dur;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox_applied: %s was not received by consumer %s in this transaction '
            '(call obx.inbox_receive first, in the same transaction, and only on ''process'')',
            coalesce(event_id, 'NULL'), coalesce(consumer_id, 'NULL'));
    END IF;
    DELETE FROM obx.obx_inbox_failure f WHERE f.consumer_id = consumer_id AND f.event_id = event_id;
    UPDATE obx.obx_poison p SET state = 'DONE', updated_at = now_ms
     WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'REDRIVE';
    PERFORM obx._inbox_audit(consumer_id, event_id, 'APPLIED', dur, res, now_ms);
END $$;

-- Records a handler failure, in a transaction of its own after the handler's transaction was
-- rolled back: the failure count grows; at max_failures (1..1000) the message is parked as
-- poison. poison => true parks it at once (the handler knows it can never succeed). The
-- delivery's fields are given again because the rolled-back transaction took its receipt
-- with it; the poison row keeps them for `obx poison list` and re-drive.
-- Returns 'retry' (do not acknowledge: the broker redelivers) or 'poisoned' (acknowledge).
CREATE FUNCTION obx.inbox_failed(consumer_id text, event_id text, error text,
                                 max_failures integer DEFAULT 5, poison boolean DEFAULT false,
                                 envelope_gen integer DEFAULT NULL,
                                 payload_digest text DEFAULT NULL, topic text DEFAULT NULL,
                                 "partition" integer DEFAULT NULL, "offset" bigint DEFAULT NULL,
                                 payload bytea DEFAULT NULL, event_type text DEFAULT NULL,
                                 tenant text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS TABLE (decision text, failures integer, detail text) LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    herr text;
    n integer;
    why text;
BEGIN
    PERFORM obx._check('consumer_id', consumer_id, 1, 128, 'name');
    IF event_id IS NULL OR event_id !~ '^evt-[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('event_id: %L is not an obx event ID', left(event_id, 40));
    END IF;
    IF max_failures IS NULL OR max_failures < 1 OR max_failures > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('max_failures: %s outside 1..1000', coalesce(max_failures::text, 'NULL'));
    END IF;
    herr := obx._inbox_text(CASE WHEN poison THEN 'handler refused the message as poison: '
                                 ELSE 'handler failed: ' END || coalesce(error, ''), 255);
    INSERT INTO obx.obx_inbox_failure AS f (consumer_id, event_id, failures, last_error, first_at,
        last_at)
    VALUES (consumer_id, event_id, 1, herr, now_ms, now_ms)
    ON CONFLICT ON CONSTRAINT obx_inbox_failure_pkey DO UPDATE SET failures = f.failures + 1,
        last_error = EXCLUDED.last_error, last_at = EXCLUDED.last_at
    RETURNING f.failures INTO n;
    PERFORM obx._inbox_audit(consumer_id, event_id, 'FAILED', 0, herr, now_ms);
    IF poison OR n >= max_failures THEN
        why := CASE WHEN poison THEN herr
                    ELSE format('%s handler failures, last: %s', n, left(herr, 200)) END;
        PERFORM obx._inbox_park(consumer_id, event_id, n, why, topic, "partition", "offset",
            obx._inbox_headers(event_id, envelope_gen, payload_digest, event_type, tenant, headers),
            payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, n, why;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'retry'::text, n, herr;
END $$;

-- Poison messages an operator marked for re-drive (`obx poison redrive`, the dashboard):
-- deliver each through obx.inbox_receive() as if it came from the broker; applying it (or
-- finding it applied) marks it DONE, failing it parks it again.
CREATE FUNCTION obx.inbox_redrives(consumer_id text)
RETURNS TABLE (event_id text, envelope_gen integer, payload_digest text, topic text,
               "partition" integer, "offset" bigint, payload bytea, event_type text,
               tenant text, headers jsonb) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.event_id, coalesce((h ->> 'envelope_gen')::integer, 1), h ->> 'payload_digest',
           p.topic, p.partition, p."offset", p.payload, h ->> 'event_type', h ->> 'tenant',
           jsonb_strip_nulls(jsonb_build_object(
               'obx-aggregate', CASE WHEN h ->> 'aggregate_type' IS NOT NULL
                   THEN (h ->> 'aggregate_type') || '/' || (h ->> 'aggregate_id') || '@'
                        || (h ->> 'aggregate_version') END,
               'obx-correlation-id', h ->> 'correlation_id',
               'obx-causation-id', h ->> 'causation_id',
               'traceparent', h ->> 'traceparent',
               'obx-occurred-at', h ->> 'occurred_at',
               'obx-attempt-id', h ->> 'attempt_id',
               'obx-dest-digest', h ->> 'dest_digest'))
      FROM obx.obx_poison p, LATERAL (SELECT p.headers::jsonb AS h) x
     WHERE p.consumer_id = inbox_redrives.consumer_id AND p.state = 'REDRIVE'
     ORDER BY p.parked_at, p.event_id
$$;

-- A receipt may be committed only complete: obx.inbox_receive() inserts it as RECEIVED and
-- obx.inbox_applied() completes it. Checked at commit (deferred), only for rows inserted as
-- RECEIVED: obx_inbox_process() inserts APPLIED rows and never fires it.
CREATE FUNCTION obx._inbox_complete() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM obx.obx_inbox i WHERE i.consumer_id = NEW.consumer_id
                 AND i.event_id = NEW.event_id AND i.outcome = 'RECEIVED') THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox: consumer %s received %s (decision ''process'') but did not call '
            'obx.inbox_applied() before COMMIT: roll back instead when the effect was not made',
            NEW.consumer_id, NEW.event_id);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER obx_inbox_complete AFTER INSERT ON obx.obx_inbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.outcome = 'RECEIVED')
    EXECUTE FUNCTION obx._inbox_complete();

-- The functions above validate with obx._check (version 1), which version 1 revoked from
-- PUBLIC with every other function; it reads nothing and writes nothing, so the consumer roles
-- that call the inbox functions may run it.
GRANT EXECUTE ON FUNCTION obx._check(text, text, integer, integer, text) TO PUBLIC;
