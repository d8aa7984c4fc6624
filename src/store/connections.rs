//! The store's connections, directly to PostgreSQL or through a pooler in
//! transaction mode (docs/design.md §13). Every statement of the store runs
//! through [`Connections`] or a [`StoreTransaction`]; they are the one place
//! that knows the difference.
//!
//! sqlx runs a statement with parameters in two exchanges: it prepares it
//! (Parse, Describe, Sync) and waits, then binds and executes it (Bind,
//! Execute, Sync). By default the prepared statement is named and kept for
//! the life of the connection. A pooler in transaction mode hands the
//! connection to another server between any two transactions, and, outside
//! one, between those two exchanges: a kept statement is missing on the
//! next server (or, worse, another client's statement under the same name
//! is there), and a bind may land where another client's statement was
//! prepared. So in [`PoolMode::Transaction`] every statement is unnamed
//! (never kept past its transaction), and one that is not in a transaction
//! already gets one of its own: three more round trips (`BEGIN`, the
//! separate prepare, `COMMIT`) that a direct connection does not pay.

use std::fmt;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Execute, Executor, PgConnection, PgPool, Postgres, Transaction};

use crate::domain::PoolMode;

type Results = Result<Either<PgQueryResult, PgRow>, sqlx::Error>;

/// The pool behind `database_url`, and how it reaches PostgreSQL.
#[derive(Clone)]
pub struct Connections {
    pool: PgPool,
    mode: PoolMode,
}

/// Connections straight to PostgreSQL.
impl From<PgPool> for Connections {
    fn from(pool: PgPool) -> Self {
        Self::new(pool, PoolMode::Session)
    }
}

impl fmt::Debug for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connections")
            .field("mode", &self.mode)
            .field("size", &self.pool.size())
            .finish()
    }
}

impl Connections {
    pub fn new(pool: PgPool, mode: PoolMode) -> Self {
        Self { pool, mode }
    }

    /// The pool itself, for what holds a session of its own (migrations,
    /// LISTEN): only where sessions last, [`PoolMode::Session`].
    pub fn sessions(&self) -> Option<&PgPool> {
        (self.mode == PoolMode::Session).then_some(&self.pool)
    }

    /// Connections open and idle, for the pool's metrics.
    pub fn size(&self) -> u32 {
        self.pool.size()
    }

    pub fn num_idle(&self) -> usize {
        self.pool.num_idle()
    }

    pub fn max_connections(&self) -> u32 {
        self.pool.options().get_max_connections()
    }

    pub async fn begin(&self) -> Result<StoreTransaction, sqlx::Error> {
        Ok(StoreTransaction {
            tx: self.pool.begin().await?,
            mode: self.mode,
        })
    }

    /// A transaction begun by `statement` (`BEGIN` and what goes with it,
    /// sent as one simple query).
    pub async fn begin_with(
        &self,
        statement: &'static str,
    ) -> Result<StoreTransaction, sqlx::Error> {
        Ok(StoreTransaction {
            tx: self.pool.begin_with(statement).await?,
            mode: self.mode,
        })
    }
}

/// A transaction of the store's; its statements are unnamed through a
/// pooler in transaction mode.
pub struct StoreTransaction {
    tx: Transaction<'static, Postgres>,
    mode: PoolMode,
}

impl fmt::Debug for StoreTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTransaction")
            .field("mode", &self.mode)
            .finish()
    }
}

impl StoreTransaction {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

/// A statement that is not kept: prepared unnamed, gone with its transaction.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// Runs `query` in a transaction of its own, unnamed, and answers all it
/// returned (ending with the error, if one ended it).
async fn alone<'q, E>(pool: PgPool, query: E) -> Vec<Results>
where
    E: 'q + Execute<'q, Postgres>,
{
    let mut answered = Vec::new();
    let ran = async {
        let mut tx = pool.begin().await?;
        {
            let mut results = (&mut *tx).fetch_many(Unnamed(query));
            while let Some(result) = results.next().await {
                answered.push(Ok(result?));
            }
        }
        tx.commit().await
    };
    if let Err(error) = ran.await {
        answered.push(Err(error));
    }
    answered
}

impl<'c> Executor<'c> for &'c Connections {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Results>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match self.mode {
            PoolMode::Session => self.pool.fetch_many(query),
            PoolMode::Transaction => stream::once(alone(self.pool.clone(), query))
                .flat_map(stream::iter)
                .boxed(),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match self.mode {
            PoolMode::Session => self.pool.fetch_optional(query),
            PoolMode::Transaction => {
                let pool = self.pool.clone();
                Box::pin(async move {
                    let mut tx = pool.begin().await?;
                    let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
                    tx.commit().await?;
                    Ok(row)
                })
            }
        }
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}

impl<'c> Executor<'c> for &'c mut StoreTransaction {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Results>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let connection: &'c mut PgConnection = &mut self.tx;
        match self.mode {
            PoolMode::Session => connection.fetch_many(query),
            PoolMode::Transaction => connection.fetch_many(Unnamed(query)),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let connection: &'c mut PgConnection = &mut self.tx;
        match self.mode {
            PoolMode::Session => connection.fetch_optional(query),
            PoolMode::Transaction => connection.fetch_optional(Unnamed(query)),
        }
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        let connection: &'c mut PgConnection = &mut self.tx;
        connection.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        let connection: &'c mut PgConnection = &mut self.tx;
        connection.describe(sql)
    }
}
