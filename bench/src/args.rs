//! A small command-line reader: `--name value`, `--name=value` and `--flag`.

pub struct Args(Vec<String>);

impl Args {
    pub fn new(args: Vec<String>) -> Args {
        Args(args)
    }

    /// Removes `--name value` (or `--name=value`) and returns the value.
    pub fn value(&mut self, name: &str) -> Result<Option<String>, String> {
        let prefix = format!("{name}=");
        if let Some(i) = self.0.iter().position(|a| a.starts_with(&prefix)) {
            let arg = self.0.remove(i);
            return Ok(Some(arg[prefix.len()..].to_owned()));
        }
        match self.0.iter().position(|a| a == name) {
            Some(i) if i + 1 < self.0.len() => {
                self.0.remove(i);
                Ok(Some(self.0.remove(i)))
            }
            Some(_) => Err(format!("{name} needs a value")),
            None => Ok(None),
        }
    }

    /// Removes every `--name value` and returns the values in order.
    pub fn values(&mut self, name: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        while let Some(v) = self.value(name)? {
            out.push(v);
        }
        Ok(out)
    }

    pub fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.value(name)?
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("{name}: {v:?} is not a number"))
            })
            .transpose()
    }

    /// Removes `--flag` and says whether it was there.
    pub fn flag(&mut self, name: &str) -> bool {
        match self.0.iter().position(|a| a == name) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }

    /// The first argument, when it is a subcommand (does not start with `-`).
    pub fn subcommand(&mut self) -> Option<String> {
        if self.0.first().is_some_and(|a| !a.starts_with('-')) {
            Some(self.0.remove(0))
        } else {
            None
        }
    }

    /// Fails on any argument left unread.
    pub fn done(&self) -> Result<(), String> {
        match self.0.first() {
            Some(arg) => Err(format!("unknown argument {arg:?}")),
            None => Ok(()),
        }
    }
}
