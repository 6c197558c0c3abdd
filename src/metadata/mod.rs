pub mod configsvr;
