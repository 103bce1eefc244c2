-- obx outbox schema, version 13 (PostgreSQL): the relay's write set checks itself, so that its
-- COMMIT can travel in the same round trip (issue 19, docs/performance.md section 2, "The
-- relay's COMMIT in the write set's round trip"). Applied after version 12 by pg_store.c's
-- migrate, in the same transaction, under the init advisory lock; catalogue only.
--
-- A relay transaction ends with its write set (event compare-and-sets, attempts, receipts,
-- audit rows) and COMMIT. The relay used to read the write set's results, see that every
-- compare-and-set applied, and only then send COMMIT: one round trip more per transaction.
-- Now the write set's statements raise when a compare-and-set did not apply or an attempt to
-- update does not exist, which fails the transaction on the server, and COMMIT goes in the same
-- pipeline: it commits only a write set that applied whole, and otherwise becomes a rollback.

-- Raises, always: the write set's statements call it only for a part that did not apply whole
-- (pg_store.c, WS_CHECK), so the common case calls no function at all. what and ids name the
-- rows in the message (ids: those that did not apply). missing: the rows were not found (OB006,
-- obx's OBX_ENOTFOUND: an attempt to update does not exist); otherwise a compare-and-set was
-- lost (OB005, OBX_ECONFLICT: the event changed under a locked transaction).
CREATE FUNCTION obx._ws_fail(what text, ids text, missing boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN missing THEN 'OB006' ELSE 'OB005' END,
        MESSAGE = format('obx: %s %s %s', what, ids,
                         CASE WHEN missing THEN 'not found'
                              ELSE 'changed under a locked transaction' END);
END
$f$;
